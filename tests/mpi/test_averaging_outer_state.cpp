// tests/mpi/test_averaging_outer_state.cpp — the outer optimizer's state across layout changes and parameter replacements: a local-SGD checkpoint loaded under another partition or other trainable flags, and an anchor retaken after set_step, a load, a state dict or writes through param_view, each bitwise the run that never changed.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "averaging_runs.hpp"

using namespace shardopt;
using namespace averaging_runs;
using shardopt_test::world;

namespace {

// Steps [from, to) of `plsgd` with the gradients of run `salt`; the params after each.
std::vector<std::vector<float>> run_steps(PostLocalSGDOptimizer& plsgd, const Scenario& s, int from, int to,
                                          uint32_t salt = 0) {
  std::vector<std::vector<float>> trajectory;
  for (int t = from; t < to; ++t) {
    hand_gradients(plsgd, s, t, salt);
    plsgd.step();
    trajectory.push_back(params_of(plsgd.optimizer()));
  }
  return trajectory;
}

std::shared_ptr<Communicator> replica_comm(const Scenario& s) {
  const int rank = world()->rank();
  return world()->split(rank / s.replica_size, rank);
}

// A fresh directory per test, shared by the ranks (rank 0 clears it).
std::string fresh_dir(const std::string& name) {
  const std::string dir = name + "_np" + std::to_string(world()->size());
  if (world()->rank() == 0) std::filesystem::remove_all(dir);
  world()->barrier();
  return dir;
}

void remove_dir(const std::string& dir) {
  world()->barrier();
  if (world()->rank() == 0) std::filesystem::remove_all(dir);
}

// Writes `values` (all params concatenated, id order) through the optimizer's param views.
void write_params(ZeroOptimizer& opt, const std::vector<float>& values) {
  std::size_t at = 0;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = opt.param_view(id);
    std::memcpy(v.data, values.data() + at, v.nbytes());
    at += static_cast<std::size_t>(v.numel);
  }
}

void check_same(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want, int first) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("step " << first + static_cast<int>(i));
    CHECK(shardopt_test::bitwise_equal(got[i], want[i]));
  }
}

// The outer optimizer on, averaging every 2 steps after a warmup of `warmup`.
Scenario outer_scenario(int replica_size, int64_t warmup) {
  Scenario s;
  s.replica_size = replica_size;
  s.averaging = periodic_averager(2, warmup);
  s.averaging.outer.enabled = true;
  return s;
}

}  // namespace

TEST_CASE("a local-SGD checkpoint saved under flat loads under sorted_greedy and continues bitwise",
          "[averaging][checkpoint][outer]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    INFO("replicas of " << L);
    const std::string dir = fresh_dir("outer_partition");
    Scenario flat = outer_scenario(L, 1);  // outer steps after steps 1, 3, 5, 7: momentum at the save
    const std::vector<std::vector<float>> straight = live_run(flat);
    {
      Replica replica(replica_comm(flat), flat);
      PostLocalSGDOptimizer plsgd(world(), *replica.opt, flat.averaging);
      run_steps(plsgd, flat, 0, 3);
      plsgd.save(dir);
    }
    Scenario greedy = flat;
    greedy.partition = PartitionStrategy::sorted_greedy;
    Replica replica(replica_comm(greedy), greedy);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, greedy.averaging);
    plsgd.load(dir);
    CHECK(plsgd.averager().step() == 3);
    CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), straight[2]));
    check_same(run_steps(plsgd, greedy, 3, kSteps), {straight.begin() + 3, straight.end()}, 3);
    remove_dir(dir);
  }
}

TEST_CASE("a local-SGD checkpoint saved with a frozen parameter loads into an optimizer with other flags",
          "[averaging][checkpoint][outer]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    INFO("replicas of " << L);
    const std::string dir = fresh_dir("outer_flags");
    const Scenario s = outer_scenario(L, 1);
    // The run that never changes: p0 frozen from the start.
    std::vector<std::vector<float>> straight;
    {
      Replica replica(replica_comm(s), s);
      replica.opt->set_trainable(0, false);
      PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
      straight = run_steps(plsgd, s, 0, kSteps);
    }
    {
      Replica replica(replica_comm(s), s);
      replica.opt->set_trainable(0, false);
      PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
      run_steps(plsgd, s, 0, 3);
      plsgd.save(dir);
    }
    // Loaded by an optimizer with every parameter trainable: the load takes the saved flags.
    Replica replica(replica_comm(s), s);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
    plsgd.load(dir);
    CHECK_FALSE(replica.opt->trainable(0));
    CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), straight[2]));
    check_same(run_steps(plsgd, s, 3, kSteps), {straight.begin() + 3, straight.end()}, 3);
    remove_dir(dir);
  }
}

TEST_CASE("set_step past warmup retakes the outer anchor from the current parameters", "[averaging][outer]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    INFO("replicas of " << L);
    const Scenario s = outer_scenario(L, 3);
    // Two warmup steps, then the schedule jumps to step 6 (an outer step follows at step 7).
    Replica jumped(replica_comm(s), s);
    PostLocalSGDOptimizer plsgd(world(), *jumped.opt, s.averaging);
    run_steps(plsgd, s, 0, 2);
    plsgd.averager().set_step(6);
    const std::vector<std::vector<float>> got = run_steps(plsgd, s, 6, 10);
    // The same, with an averager built at the jump: it starts from the parameters it finds.
    Replica rebuilt(replica_comm(s), s);
    std::vector<std::vector<float>> want;
    {
      PostLocalSGDOptimizer first(world(), *rebuilt.opt, s.averaging);
      run_steps(first, s, 0, 2);
    }
    PostLocalSGDOptimizer second(world(), *rebuilt.opt, s.averaging);
    second.averager().set_step(6);
    want = run_steps(second, s, 6, 10);
    check_same(got, want, 6);
  }
}

TEST_CASE("a load of the wrapped optimizer's checkpoint retakes the outer anchor", "[averaging][outer][checkpoint]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    INFO("replicas of " << L);
    const std::string dir = fresh_dir("outer_reload");
    const std::string replica_dir = dir + "/replica-" + std::to_string(world()->rank() / L);
    const Scenario s = outer_scenario(L, 3);  // the anchor is taken after step 2; outer steps at 3, 5, 7
    std::vector<std::vector<float>> straight;
    {
      Replica replica(replica_comm(s), s);
      PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
      run_steps(plsgd, s, 0, 3);
      replica.opt->save(replica_dir);
      straight = run_steps(plsgd, s, 3, kSteps);
    }
    // Another run (other gradients) to step 3, then the replica loads the straight run's state.
    Replica replica(replica_comm(s), s);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
    run_steps(plsgd, s, 0, 3, /*salt=*/1);
    replica.opt->load(replica_dir);
    check_same(run_steps(plsgd, s, 3, kSteps), straight, 3);
    remove_dir(dir);
  }
}

TEST_CASE("load_state_dict with parameters written through param_view retakes the outer anchor",
          "[averaging][outer]") {
  const Scenario s = outer_scenario(1, 3);
  std::vector<std::vector<float>> straight;
  std::vector<float> resumed_params;
  StateDict dict;
  {
    Replica replica(replica_comm(s), s);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
    resumed_params = run_steps(plsgd, s, 0, 3).back();
    replica.opt->consolidate_state_dict(0);
    dict = replica.opt->state_dict();
    straight = run_steps(plsgd, s, 3, kSteps);
  }
  Replica replica(replica_comm(s), s);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
  run_steps(plsgd, s, 0, 3, /*salt=*/1);
  // torch's resume: the model's weights, then the optimizer's state dict.
  write_params(*replica.opt, resumed_params);
  replica.opt->load_state_dict(dict);
  check_same(run_steps(plsgd, s, 3, kSteps), straight, 3);
}

TEST_CASE("weights written through param_view after the averager is built are the outer anchor",
          "[averaging][outer]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    INFO("replicas of " << L);
    Scenario s = outer_scenario(L, 0);  // an outer step after step 0 already
    Scenario loaded = s;
    loaded.param_seed = 12;
    const std::vector<std::vector<float>> want = live_run(loaded);
    std::vector<float> weights;
    for (const std::vector<float>& v : shardopt_test::SeededParams(kSizes, loaded.param_seed).values) {
      weights.insert(weights.end(), v.begin(), v.end());
    }
    // Built from other values, then the model is loaded through the views (bucket view's way).
    Replica replica(replica_comm(s), s);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
    write_params(*replica.opt, weights);
    check_same(run_steps(plsgd, s, 0, kSteps), want, 0);
  }
}

TEST_CASE("a ModelAverager on its own restarts the outer optimizer from a plain average after a load",
          "[averaging][outer][checkpoint]") {
  const int rank = world()->rank();
  const int replicas = world()->size();
  const std::string dir = fresh_dir("outer_standalone");
  const std::string replica_dir = dir + "/replica-" + std::to_string(rank);
  const Scenario s = outer_scenario(1, 0);  // outer steps after steps 0, 2, 4
  Replica replica(replica_comm(s), s);
  ZeroOptimizer& opt = *replica.opt;
  ModelAverager averager(world(), opt, s.averaging);
  opt.save(replica_dir);
  auto local_step = [&](int t) {
    for (std::size_t id = 0; id < kSizes.size(); ++id) {
      const std::vector<float> g = local_grad(rank, t, id);
      std::memcpy(opt.grad_view(static_cast<ParamId>(id)).data, g.data(), g.size() * sizeof(float));
    }
    opt.reduce_gradients();
    opt.step();
  };
  for (int t = 0; t < 3; ++t) {
    local_step(t);
    averager.average_parameters();
  }
  opt.load(replica_dir);  // the parameters go back to the start; the averager is not told
  local_step(3);
  averager.average_parameters();
  local_step(4);
  // The plain average as the averager takes it: each replica's values divided by their count, summed.
  std::vector<float> want = params_of(opt);
  for (float& x : want) x /= static_cast<float>(replicas);
  world()->all_reduce(want.data(), static_cast<int64_t>(want.size()), DType::f32, ReduceOp::sum);
  averager.average_parameters();
  const std::vector<float> got = params_of(opt);
  if (replicas <= 2) {
    CHECK(shardopt_test::bitwise_equal(got, want));
  } else {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-6f * (1.f + std::fabs(want[i])));
  }
  remove_dir(dir);
}

TEST_CASE("a damaged outer-optimizer file is refused on every rank before anything changes",
          "[averaging][outer][checkpoint]") {
  const int rank = world()->rank();
  const std::string dir = fresh_dir("outer_damaged");
  const Scenario s = outer_scenario(1, 1);
  Replica replica(replica_comm(s), s);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
  run_steps(plsgd, s, 0, 2);
  plsgd.save(dir);
  if (rank == 0) {  // one byte of the last file's momentum
    std::filesystem::path outer;
    for (const auto& save : std::filesystem::directory_iterator(dir)) {
      if (!save.is_directory()) continue;
      for (const auto& f : std::filesystem::directory_iterator(save.path())) {
        if (f.path().filename().string().rfind("outer-", 0) == 0) outer = f.path();
      }
    }
    REQUIRE(!outer.empty());
    std::fstream file(outer, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  world()->barrier();
  run_steps(plsgd, s, 2, 3);
  const std::vector<float> before = params_of(*replica.opt);
  const auto [code, message] = shardopt_test::error_of([&] { plsgd.load(dir); });
  CHECK(code == ErrorCode::corrupt);
  CHECK_THAT(message, Catch::Contains("outer-") && Catch::Contains("checksum"));
  CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), before));
  CHECK(plsgd.averager().step() == 3);
  remove_dir(dir);
}
