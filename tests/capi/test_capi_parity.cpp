// tests/capi/test_capi_parity.cpp — C ABI calls against their C++ counterparts: step_without and join_step bitwise as step(without_grad) and join_step(), their bad input failing on every rank, and the C++ constructor's two argument orders and the C create building the same optimizer.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Each test's communicator (CommHandle) has a 20 s timeout: a regression that leaves a rank out
// of a collective fails these tests within seconds instead of hanging them.

using Params = std::vector<std::vector<float>>;
const std::vector<int64_t> kSizes = {37, 5, 128, 9};
constexpr double kLr = 0.01;
constexpr double kWeightDecay = 0.02;

// Initial values, the same on every rank; both APIs copy them into their own buffers.
struct Initial {
  std::vector<std::string> names;
  Params values;
  Initial() {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(shardopt_test::seeded_values(41u + static_cast<uint32_t>(i), kSizes[i]));
    }
  }
};

// This rank's gradient: exact in f32 when summed over any number of ranks (multiples of 1/8),
// different per rank so that the average matters. A param sitting the step out gets 1e30,
// which the step must not read.
float grad_value(int32_t id, int step, int64_t i, int rank, bool sits_out) {
  if (sits_out) return 1e30f;
  return 0.125f * static_cast<float>((i * 3 + id + step) % 9 - 4) * static_cast<float>(rank + 1);
}

bool named(const std::vector<int32_t>& ids, int32_t id) {
  for (int32_t x : ids) {
    if (x == id) return true;
  }
  return false;
}

// ---- the C side ---------------------------------------------------------------------------------

shardopt_optimizer_t c_create(shardopt_comm_t comm, const Initial& init, int64_t overlap = SHARDOPT_OVERLAP_OFF) {
  std::vector<shardopt_param_desc> descs;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    shardopt_param_desc d;
    shardopt_param_desc_init(&d);
    d.name = init.names[i].c_str();
    d.param.data = const_cast<float*>(init.values[i].data());  // read only: initial values
    d.param.numel = kSizes[i];
    d.param.dtype = SHARDOPT_DTYPE_F32;
    d.param.device_kind = SHARDOPT_DEVICE_CPU;
    d.param.device_index = 0;
    descs.push_back(d);
  }
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = kLr;
  hyper.weight_decay = kWeightDecay;
  hyper.amsgrad = 1;
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = descs.data();
  group.num_params = descs.size();
  group.hyperparams = &hyper;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAM;
  config.bucket_bytes = 64;  // several buckets
  config.overlap = overlap;
  shardopt_optimizer_t opt = nullptr;
  const shardopt_status status = shardopt_optimizer_create(comm, &config, &group, 1, &opt);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  return opt;
}

void c_write_grads(shardopt_optimizer_t opt, int step, int rank, const std::vector<int32_t>& without) {
  for (int32_t id = 0; id < static_cast<int32_t>(kSizes.size()); ++id) {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
    float* g = static_cast<float*>(view.data);
    for (int64_t i = 0; i < view.numel; ++i) g[i] = grad_value(id, step, i, rank, named(without, id));
  }
}

Params c_params(shardopt_optimizer_t opt) {
  Params out;
  for (int32_t id = 0; id < static_cast<int32_t>(kSizes.size()); ++id) {
    shardopt_tensor v{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
    const float* data = static_cast<const float*>(v.data);
    out.emplace_back(data, data + v.numel);
  }
  return out;
}

std::vector<int64_t> c_param_steps(shardopt_optimizer_t opt) {
  std::vector<int64_t> out;
  for (int32_t id = 0; id < static_cast<int32_t>(kSizes.size()); ++id) {
    int64_t steps = -1;
    REQUIRE(shardopt_optimizer_param_step(opt, id, &steps) == SHARDOPT_OK);
    out.push_back(steps);
  }
  return out;
}

// ---- the C++ side -------------------------------------------------------------------------------

shardopt::OptimizerConfig cpp_config() {
  shardopt::OptimizerConfig config;
  config.algorithm = shardopt::Algorithm::adam;
  config.bucket_bytes = 64;
  return config;
}

std::vector<shardopt::ParamGroupSpec> cpp_groups(const Initial& init) {
  shardopt::ParamGroupSpec group;
  group.hyper.lr = kLr;
  group.hyper.weight_decay = kWeightDecay;
  group.hyper.amsgrad = true;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    group.params.push_back({init.names[i], {const_cast<float*>(init.values[i].data()), kSizes[i]}, {}});
  }
  return {group};
}

void cpp_write_grads(shardopt::ZeroOptimizer& opt, int step, int rank, const std::vector<int32_t>& without) {
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    float* g = static_cast<float*>(opt.grad_view(id).data);
    for (int64_t i = 0; i < opt.grad_view(id).numel; ++i) g[i] = grad_value(id, step, i, rank, named(without, id));
  }
}

Params cpp_params(const shardopt::ZeroOptimizer& opt) {
  Params out;
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef v = opt.param_view(id);
    out.emplace_back(v.as<float>(), v.as<float>() + v.numel);
  }
  return out;
}

std::vector<int64_t> cpp_param_steps(const shardopt::ZeroOptimizer& opt) {
  std::vector<int64_t> out;
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) out.push_back(opt.param_step(id));
  return out;
}

void check_bitwise(const Params& got, const Params& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t id = 0; id < got.size(); ++id) {
    CAPTURE(id);
    CHECK(shardopt_test::bitwise_equal(got[id], expected[id]));
  }
}

// Which params sit step `s` out: ids 3 and 1 (named twice: repeats count once) at steps 1 and 2.
std::vector<int32_t> sitting_out(int s) {
  if (s == 1 || s == 2) return {3, 1, 3};
  return {};
}

}  // namespace

TEST_CASE("step_without through the C ABI equals step(without_grad) through the C++ API bitwise",
          "[capi][step_without]") {
  shardopt_capi_test::CommHandle comm(20);
  const Initial init;
  shardopt_optimizer_t opt = c_create(comm.get(), init);
  shardopt::ZeroOptimizer reference(shardopt_test::world(), cpp_groups(init), cpp_config());
  for (int s = 0; s < 4; ++s) {
    const std::vector<int32_t> without = sitting_out(s);
    c_write_grads(opt, s, comm.rank(), without);
    cpp_write_grads(reference, s, comm.rank(), without);
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    reference.reduce_gradients();
    shardopt_status stepped = SHARDOPT_OK;
    if (s == 0) {
      stepped = shardopt_optimizer_step_without(opt, nullptr, 0);  // NULL with count 0: a plain step
    } else if (s == 3) {
      stepped = shardopt_optimizer_step(opt);
    } else {
      stepped = shardopt_optimizer_step_without(opt, without.data(), static_cast<int64_t>(without.size()));
    }
    INFO(last_error());
    REQUIRE(stepped == SHARDOPT_OK);
    reference.step(std::vector<shardopt::ParamId>(without.begin(), without.end()));
  }
  check_bitwise(c_params(opt), cpp_params(reference));
  CHECK(c_param_steps(opt) == std::vector<int64_t>{4, 2, 4, 2});
  CHECK(cpp_param_steps(reference) == std::vector<int64_t>{4, 2, 4, 2});
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("step_without's bad input fails on every rank with its status and steps nothing",
          "[capi][step_without][errors]") {
  shardopt_capi_test::CommHandle comm(20);
  const Initial init;
  shardopt_optimizer_t opt = c_create(comm.get(), init);
  const int culprit = comm.size() - 1;  // the one rank with the bad argument
  const bool mine = comm.rank() == culprit;
  const std::string failed_on = "step failed on rank " + std::to_string(culprit) + ": ";
  const std::vector<int32_t> good = {1};

  auto expect_failure = [&](shardopt_status status, shardopt_status culprit_status, const std::string& fragment) {
    INFO(last_error());
    CHECK(status == (mine ? culprit_status : SHARDOPT_ERR_INVALID_ARGUMENT));
    CHECK(contains(last_error(), "shardopt_optimizer_step_without: "));
    CHECK(contains(last_error(), fragment));
    if (!mine) CHECK(contains(last_error(), failed_on));
    CHECK(c_param_steps(opt) == std::vector<int64_t>{0, 0, 0, 0});
  };

  SECTION("an id out of range") {
    const std::vector<int32_t> bad = {1, 99};
    const std::vector<int32_t>& ids = mine ? bad : good;
    expect_failure(shardopt_optimizer_step_without(opt, ids.data(), static_cast<int64_t>(ids.size())),
                   SHARDOPT_ERR_INVALID_ARGUMENT, "parameter id 99 is out of range (0..3)");
  }
  SECTION("a negative id") {
    const int32_t bad = -2;
    expect_failure(shardopt_optimizer_step_without(opt, mine ? &bad : good.data(), 1), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "parameter id -2 is out of range");
  }
  SECTION("a negative count") {
    expect_failure(shardopt_optimizer_step_without(opt, good.data(), mine ? -1 : 1), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "count is -1; it must be 0 or more");
  }
  SECTION("NULL ids with a count") {
    expect_failure(shardopt_optimizer_step_without(opt, mine ? nullptr : good.data(), 1), SHARDOPT_ERR_NULL_POINTER,
                   "ids is NULL");
  }
  SECTION("ranks naming different params") {
    // (One rank has no other to differ from; returning here would leak the optimizer.)
    const std::vector<int32_t> other = {2};
    const std::vector<int32_t>& ids = mine && comm.size() > 1 ? other : good;
    if (comm.size() > 1) {
      const shardopt_status status = shardopt_optimizer_step_without(opt, ids.data(), 1);
      INFO(last_error());
      CHECK(status == SHARDOPT_ERR_MISMATCH);
      CHECK(contains(last_error(), "params without a gradient"));
      CHECK(c_param_steps(opt) == std::vector<int64_t>{0, 0, 0, 0});
    }
  }
  // Nothing was poisoned: the same optimizer steps on, with param 1 sitting out.
  c_write_grads(opt, 0, comm.rank(), good);
  const shardopt_status status = shardopt_optimizer_step_without(opt, good.data(), 1);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  CHECK(c_param_steps(opt) == std::vector<int64_t>{1, 0, 1, 1});
  CHECK(shardopt_optimizer_step_without(nullptr, nullptr, 0) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("step_without's bad input under overlap fails on every rank after the last step's gathers land",
          "[capi][step_without][errors][overlap]") {
  shardopt_capi_test::CommHandle comm(20);
  const Initial init;
  shardopt_optimizer_t opt = c_create(comm.get(), init, SHARDOPT_OVERLAP_AFTER_BACKWARD);
  const bool mine = comm.rank() == comm.size() - 1;
  const int32_t one = 1;
  for (int s = 0; s < 2; ++s) {
    // Handed in backward order; the first step's all-gathers are still in flight at the second.
    c_write_grads(opt, s, comm.rank(), {});
    for (int32_t id = static_cast<int32_t>(kSizes.size()) - 1; id >= 0; --id) {
      REQUIRE(shardopt_optimizer_grad_ready(opt, id) == SHARDOPT_OK);
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    if (s == 1) {
      const shardopt_status status = shardopt_optimizer_step_without(opt, &one, mine ? -3 : 1);
      const std::string message = last_error();
      INFO(message);
      CHECK(status == SHARDOPT_ERR_INVALID_ARGUMENT);
      CHECK(contains(message, "count is -3"));
      CHECK(c_param_steps(opt) == std::vector<int64_t>{1, 1, 1, 1});
    }
    const shardopt_status status = shardopt_optimizer_step_without(opt, s == 1 ? &one : nullptr, s);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
  }
  REQUIRE(shardopt_optimizer_wait_all(opt) == SHARDOPT_OK);
  CHECK(c_param_steps(opt) == std::vector<int64_t>{2, 1, 2, 2});
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

namespace {

// Rank r takes 1 + r steps (param 1 sitting out the second), then joins one pass at a time;
// `join_pass` runs one pass and returns whether it shadowed a step. Returns how many passes
// shadowed a step.
template <typename Steps, typename JoinPass>
int uneven_run(int rank, Steps&& take_step, JoinPass&& join_pass) {
  for (int s = 0; s < 1 + rank; ++s) take_step(s, s == 1 ? std::vector<int32_t>{1} : std::vector<int32_t>{});
  int shadowed = 0;
  while (join_pass()) ++shadowed;
  return shadowed;
}

}  // namespace

TEST_CASE("join_step through the C ABI equals join_step() through the C++ API bitwise", "[capi][join]") {
  shardopt_capi_test::CommHandle comm(20);
  const Initial init;
  const int rank = comm.rank();
  shardopt_optimizer_t opt = c_create(comm.get(), init);
  const int c_shadowed = uneven_run(
      rank,
      [&](int s, const std::vector<int32_t>& without) {
        c_write_grads(opt, s, rank, without);
        REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
        REQUIRE(shardopt_optimizer_step_without(opt, without.data(), static_cast<int64_t>(without.size())) ==
                SHARDOPT_OK);
      },
      [&] {
        int shadowed = -1;
        const shardopt_status status = shardopt_optimizer_join_step(opt, &shadowed);
        INFO(last_error());
        REQUIRE(status == SHARDOPT_OK);
        REQUIRE((shadowed == 0 || shadowed == 1));
        return shadowed == 1;
      });
  // Every rank is in join: another pass returns at once, and the output is optional.
  CHECK(shardopt_optimizer_join_step(opt, nullptr) == SHARDOPT_OK);

  shardopt::ZeroOptimizer reference(shardopt_test::world(), cpp_groups(init), cpp_config());
  const int cpp_shadowed = uneven_run(
      rank,
      [&](int s, const std::vector<int32_t>& without) {
        cpp_write_grads(reference, s, rank, without);
        reference.reduce_gradients();
        reference.step(std::vector<shardopt::ParamId>(without.begin(), without.end()));
      },
      [&] { return reference.join_step(); });

  // Rank r shadows the steps of the ranks that go on after it: size - 1 - r of them.
  CHECK(c_shadowed == comm.size() - 1 - rank);
  CHECK(cpp_shadowed == c_shadowed);
  const Params got = c_params(opt);
  check_bitwise(got, cpp_params(reference));
  CHECK(c_param_steps(opt) == cpp_param_steps(reference));
  // And every rank ends with rank 0's parameters.
  for (const std::vector<float>& p : got) {
    std::vector<float> root = p;
    shardopt_test::world()->broadcast(root.data(), static_cast<int64_t>(root.size()), shardopt::DType::f32, 0);
    CHECK(shardopt_test::bitwise_equal(root, p));
  }
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("join_step beside a call join does not shadow fails on every rank, naming both", "[capi][join][errors]") {
  shardopt_capi_test::CommHandle comm(20);
  if (comm.size() < 2) return;
  const Initial init;
  shardopt_optimizer_t opt = c_create(comm.get(), init);
  const int last = comm.size() - 1;
  int shadowed = -1;
  const bool joined = comm.rank() == last;
  const shardopt_status status =
      joined ? shardopt_optimizer_join_step(opt, &shadowed) : shardopt_optimizer_consolidate_state_dict(opt, 0);
  const std::string message = last_error();  // before any other call clears it
  INFO(message);
  CHECK(status == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(message, "consolidate_state_dict(): rank " + std::to_string(last) + " is in join()"));
  if (joined) {
    CHECK(contains(message, "shardopt_optimizer_join_step: "));
    CHECK(shadowed == 0);
  }
  CHECK(shardopt_optimizer_join_step(nullptr, &shadowed) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("the C++ constructor's two argument orders and the C create build the same optimizer", "[capi][step]") {
  shardopt_capi_test::CommHandle comm(20);
  const Initial init;
  // (comm, groups, config), the documented order; (comm, config, groups), the earlier one; and
  // shardopt_optimizer_create(comm, config, groups), the C ABI's.
  shardopt::ZeroOptimizer groups_first(shardopt_test::world(), cpp_groups(init), cpp_config());
  shardopt::ZeroOptimizer config_first(shardopt_test::world(), cpp_config(), cpp_groups(init));
  shardopt_optimizer_t opt = c_create(comm.get(), init);
  // The config of the new order defaults like the old one's OptimizerConfig{}.
  shardopt::ZeroOptimizer defaults_new(shardopt_test::world(), cpp_groups(init));
  shardopt::ZeroOptimizer defaults_old(shardopt_test::world(), shardopt::OptimizerConfig{}, cpp_groups(init));
  for (int s = 0; s < 3; ++s) {
    for (shardopt::ZeroOptimizer* o : {&groups_first, &config_first, &defaults_new, &defaults_old}) {
      cpp_write_grads(*o, s, comm.rank(), {});
      o->reduce_gradients();
      o->step();
    }
    c_write_grads(opt, s, comm.rank(), {});
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  CHECK(groups_first.config().bucket_bytes == 64);
  CHECK(groups_first.num_buckets() == config_first.num_buckets());
  const Params expected = cpp_params(config_first);
  check_bitwise(cpp_params(groups_first), expected);
  check_bitwise(c_params(opt), expected);
  check_bitwise(cpp_params(defaults_new), cpp_params(defaults_old));
  // The steps moved the parameters (a comparison of untouched values would prove nothing).
  CHECK_FALSE(shardopt_test::bitwise_equal(expected[0], init.values[0]));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
