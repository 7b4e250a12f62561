// tests/capi/test_capi_null_handles.cpp — a negative colour in shardopt_comm_split gives a NULL handle, and every function refuses NULL comm and optimizer handles by name instead of crashing.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "capi_test_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

namespace {

const char* const kNullComm =
    "comm is NULL; shardopt_comm_split gives a NULL handle on ranks that passed a negative colour (they join no "
    "communicator)";
const char* const kNullOpt = "opt is NULL; shardopt_optimizer_create leaves its output NULL when it fails";

// Every call below on a NULL handle: SHARDOPT_ERR_NULL_POINTER, and the message names the
// function and the handle's argument, with the reason it may be NULL.
void check_refused(const char* function, shardopt_status status, const char* why) {
  INFO(function);
  CHECK(status == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == std::string(function) + ": " + why);
}

}  // namespace

TEST_CASE("a rank passing a negative colour to split gets a NULL handle that every comm function refuses",
          "[capi][errors][split]") {
  CommHandle world;
  const int rank = world.rank();
  const int size = world.size();
  // The last rank opts out; the others (if any) form a communicator of size - 1.
  const bool opts_out = rank == size - 1;
  shardopt_comm_t sub = reinterpret_cast<shardopt_comm_t>(&world);  // overwritten either way
  REQUIRE(shardopt_comm_split(world.get(), opts_out ? -1 : 0, rank, &sub) == SHARDOPT_OK);
  if (!opts_out) {
    REQUIRE(sub != nullptr);
    int sub_size = 0;
    int sub_rank = -1;
    CHECK(shardopt_comm_size(sub, &sub_size) == SHARDOPT_OK);
    CHECK(shardopt_comm_rank(sub, &sub_rank) == SHARDOPT_OK);
    CHECK(sub_size == size - 1);
    CHECK(sub_rank == rank);
    CHECK(shardopt_comm_barrier(sub) == SHARDOPT_OK);
    CHECK(shardopt_comm_destroy(sub) == SHARDOPT_OK);
    // Only this rank's own handle: the rank that opted out runs its checks alone.
    return;
  }
  REQUIRE(sub == nullptr);

  int value = 12345;
  check_refused("shardopt_comm_rank", shardopt_comm_rank(sub, &value), kNullComm);
  check_refused("shardopt_comm_size", shardopt_comm_size(sub, &value), kNullComm);
  CHECK(value == 12345);  // untouched
  check_refused("shardopt_comm_barrier", shardopt_comm_barrier(sub), kNullComm);
  shardopt_comm_t child = reinterpret_cast<shardopt_comm_t>(&world);
  check_refused("shardopt_comm_split", shardopt_comm_split(sub, 0, 0, &child), kNullComm);

  std::vector<float> values(4, 1.0f);
  shardopt_param_desc param;
  shardopt_param_desc_init(&param);
  param.name = "w";
  param.param.data = values.data();
  param.param.numel = 4;
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = &param;
  group.num_params = 1;
  shardopt_optimizer_t opt = reinterpret_cast<shardopt_optimizer_t>(&world);
  check_refused("shardopt_optimizer_create", shardopt_optimizer_create(sub, nullptr, &group, 1, &opt), kNullComm);
  // Destroying NULL stays a no-op, as free(NULL), so that cleanup code needs no special case.
  CHECK(shardopt_comm_destroy(sub) == SHARDOPT_OK);
  CHECK(last_error().empty());
}

TEST_CASE("every optimizer function refuses a NULL optimizer with a message naming it", "[capi][errors]") {
  // Single-process checks: none of these reach a collective, NULL is refused first.
  const shardopt_optimizer_t opt = nullptr;
  int32_t i32 = 0;
  int i = 0;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double d = 0;
  void* stream = nullptr;
  shardopt_tensor tensor{};
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  shardopt_step_report step;
  shardopt_step_report_init(&step);
  shardopt_memory_report memory;
  shardopt_memory_report_init(&memory);

  const std::vector<std::pair<const char*, std::function<shardopt_status()>>> calls = {
      {"shardopt_optimizer_add_param_group", [&] { return shardopt_optimizer_add_param_group(opt, &group, &i32); }},
      {"shardopt_optimizer_num_groups", [&] { return shardopt_optimizer_num_groups(opt, &i32); }},
      {"shardopt_optimizer_num_params", [&] { return shardopt_optimizer_num_params(opt, &i32); }},
      {"shardopt_optimizer_find_param", [&] { return shardopt_optimizer_find_param(opt, "w", &i32); }},
      {"shardopt_optimizer_get_hyperparams", [&] { return shardopt_optimizer_get_hyperparams(opt, 0, &hyper); }},
      {"shardopt_optimizer_get_defaults", [&] { return shardopt_optimizer_get_defaults(opt, &hyper); }},
      {"shardopt_optimizer_set_hyperparams", [&] { return shardopt_optimizer_set_hyperparams(opt, 0, &hyper); }},
      {"shardopt_optimizer_set_trainable", [&] { return shardopt_optimizer_set_trainable(opt, 0, 1); }},
      {"shardopt_optimizer_get_trainable", [&] { return shardopt_optimizer_get_trainable(opt, 0, &i); }},
      {"shardopt_optimizer_param_step", [&] { return shardopt_optimizer_param_step(opt, 0, &i64); }},
      {"shardopt_optimizer_param_view", [&] { return shardopt_optimizer_param_view(opt, 0, &tensor); }},
      {"shardopt_optimizer_grad_view", [&] { return shardopt_optimizer_grad_view(opt, 0, &tensor); }},
      {"shardopt_optimizer_param_owner", [&] { return shardopt_optimizer_param_owner(opt, 0, &i32); }},
      {"shardopt_optimizer_layout_version", [&] { return shardopt_optimizer_layout_version(opt, &u64); }},
      {"shardopt_optimizer_zero_grad", [&] { return shardopt_optimizer_zero_grad(opt); }},
      {"shardopt_optimizer_reduce_gradients", [&] { return shardopt_optimizer_reduce_gradients(opt); }},
      {"shardopt_optimizer_reduce_gradient", [&] { return shardopt_optimizer_reduce_gradient(opt, 0, &tensor); }},
      {"shardopt_optimizer_reduce_gradient_dlpack",
       [&] { return shardopt_optimizer_reduce_gradient_dlpack(opt, 0, nullptr); }},
      {"shardopt_optimizer_clip_grad_norm", [&] { return shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, &d); }},
      {"shardopt_optimizer_loss_scale", [&] { return shardopt_optimizer_loss_scale(opt, &d); }},
      {"shardopt_optimizer_set_loss_scale", [&] { return shardopt_optimizer_set_loss_scale(opt, 2.0); }},
      {"shardopt_optimizer_step", [&] { return shardopt_optimizer_step(opt); }},
      {"shardopt_optimizer_last_step", [&] { return shardopt_optimizer_last_step(opt, &step); }},
      {"shardopt_optimizer_cuda_stream", [&] { return shardopt_optimizer_cuda_stream(opt, &stream); }},
      {"shardopt_optimizer_memory_report", [&] { return shardopt_optimizer_memory_report(opt, &memory); }},
      {"shardopt_optimizer_save", [&] { return shardopt_optimizer_save(opt, "unused"); }},
      {"shardopt_optimizer_save_async", [&] { return shardopt_optimizer_save_async(opt, "unused"); }},
      {"shardopt_optimizer_wait_save", [&] { return shardopt_optimizer_wait_save(opt); }},
      {"shardopt_optimizer_load", [&] { return shardopt_optimizer_load(opt, "unused"); }},
      {"shardopt_optimizer_consolidate_state_dict", [&] { return shardopt_optimizer_consolidate_state_dict(opt, 0); }},
  };
  for (const auto& [function, call] : calls) check_refused(function, call(), kNullOpt);
  CHECK(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
