// tests/mpi/test_overlap_round_gate.cpp — with config.overlap = per_bucket, calls between reduce_gradients() (the buckets already updated) and step() are refused by name on every rank, and the run goes on bitwise as if they had not been made.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};

std::shared_ptr<Communicator> fresh_comm() {
  CommOptions options;
  options.timeout_seconds = 20;  // a rank left in a collective fails the test in seconds
  return mpi_world(options);
}

std::vector<float> grad_of(int rank, int step, std::size_t param) {
  return shardopt_test::seeded_values(700u + static_cast<uint32_t>(rank * 17 + step * 5) + static_cast<uint32_t>(param),
                                      kSizes[param]);
}

struct Model {
  shardopt_test::SeededParams params{kSizes, 3};
  shardopt_test::SeededParams extra{{{"extra", 40}}, 4};
  std::unique_ptr<ZeroOptimizer> opt;
  int stage;

  Model(int stage_, OverlapPolicy overlap) : stage(stage_) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.stage = stage;
    config.bucket_bytes = 256;
    config.overlap = overlap;
    opt = std::make_unique<ZeroOptimizer>(fresh_comm(), config, std::vector<ParamGroupSpec>{params.all()});
  }

  // Hands the gradients over and reduces them: with per_bucket every bucket is updated here.
  void hand_and_reduce(int step) {
    shardopt_test::hand_gradients_backward(
        *opt, stage, [&](ParamId i) { return grad_of(world()->rank(), step, static_cast<std::size_t>(i)); });
    opt->reduce_gradients();
  }

  std::vector<uint8_t> bytes() { return shardopt_test::param_bytes(*opt); }

  std::vector<int64_t> steps() const {
    std::vector<int64_t> out;
    for (ParamId id = 0; id < opt->num_params(); ++id) out.push_back(opt->param_step(id));
    return out;
  }
};

std::string shared_dir(const char* what) {
  std::string name = std::string("shardopt-round-gate-") + what + "-" +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  world()->broadcast(name.data(), static_cast<int64_t>(name.size()), DType::byte, 0);
  return (std::filesystem::temp_directory_path() / name).string();
}

// Between reduce_gradients() and step() of a per_bucket round, `call` must raise the named
// refusal on every rank and change nothing: the step that follows, and the next round, give the
// bytes and step counts of a run that never made the call.
void check_refused(const char* name, const std::function<void(Model&)>& call) {
  for (int stage : {1, 2}) {
    INFO(name << " at stage " << stage);
    Model plain(stage, OverlapPolicy::off);
    Model m(stage, OverlapPolicy::per_bucket);
    for (int step = 0; step < 2; ++step) {
      plain.hand_and_reduce(step);
      plain.opt->step();
      m.hand_and_reduce(step);
      if (step == 1) {
        // (Not error_of: a call that goes through must still show what it did to the run below.)
        std::string what = "(no error)";
        ErrorCode code = ErrorCode::internal;
        try {
          call(m);
        } catch (const Error& e) {
          code = e.code();
          what = e.what();
        }
        CHECK(code == ErrorCode::invalid_argument);
        CHECK_THAT(what, Catch::StartsWith(name) && Catch::Contains("per_bucket") &&
                             Catch::Contains("already updated") && Catch::Contains("call step() first"));
      }
      m.opt->step();
      REQUIRE(m.bytes() == plain.bytes());
      REQUIRE(m.steps() == plain.steps());
    }
    CHECK(m.opt->num_groups() == 1);
    CHECK(m.opt->num_params() == static_cast<int>(kSizes.size()));
    for (ParamId id = 0; id < m.opt->num_params(); ++id) CHECK(m.opt->trainable(id));
  }
}

}  // namespace

TEST_CASE("per_bucket: save between reduce_gradients and step is refused", "[overlap][gate]") {
  const std::string dir = shared_dir("save");
  check_refused("save", [&](Model& m) { m.opt->save(dir); });
  check_refused("save_async", [&](Model& m) { m.opt->save_async(dir); });
  world()->barrier();
  CHECK(!std::filesystem::exists(dir));  // nothing was written
}

TEST_CASE("per_bucket: consolidate_state_dict between reduce_gradients and step is refused", "[overlap][gate]") {
  check_refused("consolidate_state_dict", [](Model& m) { m.opt->consolidate_state_dict(0); });
}

TEST_CASE("per_bucket: set_trainable between reduce_gradients and step is refused", "[overlap][gate]") {
  check_refused("set_trainable", [](Model& m) { m.opt->set_trainable(2, false); });
}

TEST_CASE("per_bucket: add_param_group between reduce_gradients and step is refused", "[overlap][gate]") {
  check_refused("add_param_group", [](Model& m) { m.opt->add_param_group(m.extra.all()); });
}

TEST_CASE("per_bucket: load and load_state_dict between reduce_gradients and step are refused", "[overlap][gate]") {
  const std::string dir = shared_dir("load");
  {
    Model source(1, OverlapPolicy::off);
    source.hand_and_reduce(0);
    source.opt->step();
    source.opt->save(dir);
  }
  check_refused("load", [&](Model& m) { m.opt->load(dir); });
  check_refused("load_state_dict", [](Model& m) { m.opt->load_state_dict(StateDict{}); });
  world()->barrier();
  if (world()->rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("after_backward: a save between reduce_gradients and step is still taken", "[overlap][gate]") {
  // Nothing is updated before step() with after_backward: the call is legal there.
  const std::string dir = shared_dir("after-backward");
  Model m(1, OverlapPolicy::after_backward);
  m.hand_and_reduce(0);
  m.opt->save(dir);
  m.opt->step();
  world()->barrier();
  CHECK(std::filesystem::exists(dir));
  world()->barrier();
  if (world()->rank() == 0) std::filesystem::remove_all(dir);
}

// Hands the gradients of `step` over backward, calling `midway` after the first half.
void hand_with_midway(Model& m, int step, const std::function<void()>& midway) {
  int handed = 0;
  shardopt_test::hand_gradients_backward(*m.opt, m.stage, [&](ParamId i) {
    if (handed++ == static_cast<int>(kSizes.size()) / 2) midway();
    return grad_of(world()->rank(), step, static_cast<std::size_t>(i));
  });
}

TEST_CASE("per_bucket: a hyperparameter change inside a round reaches the next round whole", "[overlap][gate]") {
  // The reference changes the learning rate after step(); per_bucket changes it in the middle
  // of the hand-over (buckets already updating on the communication thread) or between
  // reduce_gradients() and step(): every bucket of the round must still take the old value,
  // and the next round the new one.
  for (int stage : {1, 2}) {
    for (int where = 0; where < 2; ++where) {
      INFO("stage " << stage << (where == 0 ? ", during the hand-over" : ", after reduce_gradients"));
      Model plain(stage, OverlapPolicy::off);
      Model m(stage, OverlapPolicy::per_bucket);
      for (int step = 0; step < 4; ++step) {
        const double lr = 1e-2 * (step + 1);
        plain.hand_and_reduce(step);
        plain.opt->step();
        plain.opt->hyperparams(0).lr = lr;
        const auto change = [&] { m.opt->hyperparams(0).lr = lr; };
        if (where == 0) {
          hand_with_midway(m, step, change);
          m.opt->reduce_gradients();
        } else {
          m.hand_and_reduce(step);
          change();
        }
        m.opt->step();
        REQUIRE(m.bytes() == plain.bytes());
      }
    }
  }
}
