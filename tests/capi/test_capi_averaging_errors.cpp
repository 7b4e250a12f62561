// tests/capi/test_capi_averaging_errors.cpp — model averaging through the C ABI refuses by name: config errors on every rank, NULL/wrong/destroyed handles, and the optimizer outliving its handle.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"
#include "capi_averaging_support.hpp"

using shardopt_capi_test::last_error;
using namespace shardopt_capi_averaging_test;

// ---- errors -------------------------------------------------------------------------------------------

TEST_CASE("bad averager configs fail the create on every rank, through the C ABI", "[capi][averaging][errors]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);

  std::vector<shardopt_averaging_level> levels;
  shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);
  shardopt_status expected = SHARDOPT_ERR_INVALID_ARGUMENT;
  std::string message;
  SECTION("a period of 0") {
    levels[0].period = 0;
    message = "period";
  }
  SECTION("no levels") {
    config.num_levels = 0;
  }
  SECTION("a negative warmup") {
    config.warmup_steps = -1;
    message = "warmup_steps";
  }
  SECTION("a group size that does not divide the world") {
    levels[0].group_size = comms.size + 1;
  }
  SECTION("levels NULL with a count") {
    config.levels = nullptr;
    expected = SHARDOPT_ERR_NULL_POINTER;
    message = "config->levels is NULL but config->num_levels is 1";
  }
  SECTION("a struct size no version has") {
    config.struct_size = sizeof(shardopt_averager_config) + 8;
    expected = SHARDOPT_ERR_STRUCT_SIZE;
    message = "config->struct_size";
  }

  for (const bool post_local_sgd : {true, false}) {
    INFO((post_local_sgd ? "shardopt_post_local_sgd_create" : "shardopt_model_averager_create"));
    shardopt_status status = SHARDOPT_OK;
    const std::string function = post_local_sgd ? "shardopt_post_local_sgd_create" : "shardopt_model_averager_create";
    if (post_local_sgd) {
      shardopt_post_local_sgd_t out = reinterpret_cast<shardopt_post_local_sgd_t>(&comms);
      status = shardopt_post_local_sgd_create(comms.world, opt, &config, &out);
      CHECK(out == nullptr);
    } else {
      shardopt_model_averager_t out = reinterpret_cast<shardopt_model_averager_t>(&comms);
      status = shardopt_model_averager_create(comms.world, opt, &config, &out);
      CHECK(out == nullptr);
    }
    INFO(last_error());
    CHECK(status == expected);
    CHECK(contains(last_error(), function + ": "));
    CHECK(contains(last_error(), message));
  }
  // The world is still usable: every rank failed in the same call.
  CAPI_OK(shardopt_comm_barrier(comms.world));
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

TEST_CASE("a create refused on one rank fails on every rank", "[capi][averaging][errors]") {
  Comms comms;
  if (comms.size < 2) return;
  // Replicas of one rank, and one replica of every rank: the refusing rank never reaches a
  // collective of its replica, so the constructor must not start with one.
  for (shardopt_comm_t replica : {comms.replica, comms.world}) {
    CModel model;
    shardopt_optimizer_t opt = model.create(replica);
    std::vector<shardopt_averaging_level> levels;
    shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);
    if (comms.rank == 1) config.struct_size = 3;
    shardopt_post_local_sgd_t out = nullptr;
    const shardopt_status status = shardopt_post_local_sgd_create(comms.world, opt, &config, &out);
    INFO(last_error());
    CHECK(out == nullptr);
    if (comms.rank == 1) {
      CHECK(status == SHARDOPT_ERR_STRUCT_SIZE);
    } else {
      CHECK(status != SHARDOPT_OK);
      CHECK(contains(last_error(), "rank 1"));
    }
    CAPI_OK(shardopt_comm_barrier(comms.world));
    CAPI_OK(shardopt_optimizer_destroy(opt));
  }
}

TEST_CASE("every averaging function refuses NULL handles by name", "[capi][averaging][errors]") {
  const shardopt_model_averager_t averager = nullptr;
  const shardopt_post_local_sgd_t plsgd = nullptr;
  int64_t i64 = 0;
  int32_t i32 = 0;
  int32_t j32 = 0;
  shardopt_tensor tensor{};
  shardopt_communication_counts counts;
  shardopt_communication_counts_init(&counts);
  const std::string null_averager =
      "averager is NULL; shardopt_model_averager_create leaves its output NULL when it fails";
  const std::string null_plsgd = "plsgd is NULL; shardopt_post_local_sgd_create leaves its output NULL when it fails";

  const std::vector<std::pair<const char*, std::function<shardopt_status()>>> averager_calls = {
      {"shardopt_model_averager_average_parameters", [&] { return shardopt_model_averager_average_parameters(averager); }},
      {"shardopt_model_averager_step", [&] { return shardopt_model_averager_step(averager, &i64); }},
      {"shardopt_model_averager_set_step", [&] { return shardopt_model_averager_set_step(averager, 1); }},
      {"shardopt_model_averager_next_group_size", [&] { return shardopt_model_averager_next_group_size(averager, &i32); }},
      {"shardopt_model_averager_replicas", [&] { return shardopt_model_averager_replicas(averager, &i32, &j32); }},
      {"shardopt_model_averager_communication", [&] { return shardopt_model_averager_communication(averager, &counts); }},
  };
  for (const auto& [function, call] : averager_calls) {
    INFO(function);
    CHECK(call() == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == std::string(function) + ": " + null_averager);
  }
  const std::vector<std::pair<const char*, std::function<shardopt_status()>>> plsgd_calls = {
      {"shardopt_post_local_sgd_reduce_gradients", [&] { return shardopt_post_local_sgd_reduce_gradients(plsgd); }},
      {"shardopt_post_local_sgd_reduce_gradient", [&] { return shardopt_post_local_sgd_reduce_gradient(plsgd, 0, &tensor); }},
      {"shardopt_post_local_sgd_reduce_gradient_dlpack",
       [&] { return shardopt_post_local_sgd_reduce_gradient_dlpack(plsgd, 0, nullptr); }},
      {"shardopt_post_local_sgd_step", [&] { return shardopt_post_local_sgd_step(plsgd); }},
      {"shardopt_post_local_sgd_save", [&] { return shardopt_post_local_sgd_save(plsgd, "unused"); }},
      {"shardopt_post_local_sgd_load", [&] { return shardopt_post_local_sgd_load(plsgd, "unused"); }},
      {"shardopt_post_local_sgd_averager_step", [&] { return shardopt_post_local_sgd_averager_step(plsgd, &i64); }},
      {"shardopt_post_local_sgd_set_averager_step", [&] { return shardopt_post_local_sgd_set_averager_step(plsgd, 1); }},
      {"shardopt_post_local_sgd_next_group_size", [&] { return shardopt_post_local_sgd_next_group_size(plsgd, &i32); }},
      {"shardopt_post_local_sgd_communication", [&] { return shardopt_post_local_sgd_communication(plsgd, &counts); }},
      {"shardopt_post_local_sgd_consolidate_state_dict",
       [&] { return shardopt_post_local_sgd_consolidate_state_dict(plsgd, 0); }},
      {"shardopt_post_local_sgd_state_dict_step",
       [&] { return shardopt_post_local_sgd_state_dict_step(plsgd, &i32, &i64); }},
  };
  for (const auto& [function, call] : plsgd_calls) {
    INFO(function);
    CHECK(call() == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == std::string(function) + ": " + null_plsgd);
  }
  // Destroying NULL is a no-op, as free(NULL).
  CHECK(shardopt_model_averager_destroy(nullptr) == SHARDOPT_OK);
  CHECK(shardopt_post_local_sgd_destroy(nullptr) == SHARDOPT_OK);

  // The creates: a NULL world fails alone (no communicator to tell the others through).
  shardopt_averager_config config;
  shardopt_averager_config_init(&config);
  shardopt_post_local_sgd_t out = nullptr;
  CHECK(shardopt_post_local_sgd_create(nullptr, nullptr, &config, &out) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_post_local_sgd_create: world is NULL"));
  shardopt_model_averager_t out_averager = nullptr;
  CHECK(shardopt_model_averager_create(nullptr, nullptr, &config, &out_averager) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_model_averager_create: world is NULL"));
}

TEST_CASE("NULL optimizers and configs, wrong kinds and destroyed handles are refused", "[capi][averaging][errors]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);

  // Collective refusals: every rank passes the same wrong argument.
  shardopt_post_local_sgd_t plsgd = nullptr;
  CHECK(shardopt_post_local_sgd_create(comms.world, nullptr, &config, &plsgd) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "opt is NULL"));
  CHECK(shardopt_post_local_sgd_create(comms.world, opt, nullptr, &plsgd) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "config is NULL"));
  CHECK(shardopt_post_local_sgd_create(comms.world, opt, &config, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "out is NULL"));
  // A communicator where an optimizer belongs.
  CHECK(shardopt_model_averager_create(comms.world, reinterpret_cast<shardopt_optimizer_t>(comms.replica), &config,
                                       nullptr) == SHARDOPT_ERR_NULL_POINTER);
  shardopt_model_averager_t averager = nullptr;
  CHECK(shardopt_model_averager_create(comms.world, reinterpret_cast<shardopt_optimizer_t>(comms.replica), &config,
                                       &averager) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "opt is a shardopt_comm_t, not a shardopt_optimizer_t"));
  CHECK(averager == nullptr);

  CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
  plsgd = create_plsgd(comms, opt, Setting{{{2, 0}}, 0, false, false});
  // Each kind where the other belongs.
  int64_t step = 0;
  CHECK(shardopt_post_local_sgd_averager_step(reinterpret_cast<shardopt_post_local_sgd_t>(averager), &step) ==
        SHARDOPT_ERR_BAD_HANDLE);
  CHECK(last_error() ==
        "shardopt_post_local_sgd_averager_step: plsgd is a shardopt_model_averager_t, not a shardopt_post_local_sgd_t");
  CHECK(shardopt_model_averager_step(reinterpret_cast<shardopt_model_averager_t>(plsgd), &step) ==
        SHARDOPT_ERR_BAD_HANDLE);
  CHECK(last_error() ==
        "shardopt_model_averager_step: averager is a shardopt_post_local_sgd_t, not a shardopt_model_averager_t");
  CHECK(shardopt_optimizer_step(reinterpret_cast<shardopt_optimizer_t>(plsgd)) == SHARDOPT_ERR_BAD_HANDLE);
  // A struct size the counts struct never had.
  shardopt_communication_counts counts;
  shardopt_communication_counts_init(&counts);
  counts.struct_size = 4;
  CHECK(shardopt_post_local_sgd_communication(plsgd, &counts) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(shardopt_model_averager_communication(averager, &counts) == SHARDOPT_ERR_STRUCT_SIZE);

  CAPI_OK(shardopt_model_averager_destroy(averager));
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  // Destroyed: refused without being dereferenced.
  CHECK(shardopt_model_averager_step(averager, &step) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "was destroyed, or never created"));
  CHECK(shardopt_post_local_sgd_step(plsgd) == SHARDOPT_ERR_BAD_HANDLE);
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

TEST_CASE("an averager keeps its optimizer alive past shardopt_optimizer_destroy", "[capi][averaging]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  const Setting setting{{{2, 0}}, 0, false, false};
  shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, setting);
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = setting.c(levels);
  shardopt_model_averager_t averager = nullptr;
  CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
  train_c(plsgd, opt, 0, 2, comms.rank);

  CAPI_OK(shardopt_optimizer_destroy(opt));
  // The handle is gone...
  int32_t n = 0;
  CHECK(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_ERR_BAD_HANDLE);
  // ...the optimizer is not: both averagers still step it.
  CAPI_OK(shardopt_post_local_sgd_reduce_gradients(plsgd));
  CAPI_OK(shardopt_post_local_sgd_step(plsgd));
  CAPI_OK(shardopt_model_averager_average_parameters(averager));
  int64_t step = 0;
  CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &step));
  CHECK(step == 3);
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  CAPI_OK(shardopt_model_averager_destroy(averager));  // the last user: frees the optimizer
}
