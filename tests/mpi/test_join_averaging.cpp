// tests/mpi/test_join_averaging.cpp — join() under post-local SGD or a ModelAverager: refused by name on every rank of the world (Error(unsupported) naming the rank that called it), never a timeout, at np 2-4, replicas of 1 and 2, in warmup and after, with the outer optimizer; the averaging's agreement, which carries it, spans every replica.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_test {

std::shared_ptr<shardopt::Communicator>& world() {
  static std::shared_ptr<shardopt::Communicator> comm;
  return comm;
}

}  // namespace shardopt_test

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {37, 64, 5, 130};
constexpr int kSteps = 6;  // the ranks that do not join run out of steps here

struct Scenario {
  int replica_size = 1;
  int stage = 1;
  OverlapPolicy overlap = OverlapPolicy::off;
  AveragerConfig averager = periodic_averager(2);
  bool post_local_sgd = true;  // false: the trainer drives the optimizer and a ModelAverager itself
  int joined_rank = 0;         // trains `joins_after` steps, then calls join()
  int joins_after = 2;
  bool everyone_joins = false;  // the other ranks call join() after kSteps (else they just stop)
};

// Where a rank's run ended: the error it raised, or none.
struct Outcome {
  bool raised = false;
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

// Each scenario's communicators and optimizers outlive every scenario: a rank that left a run
// early must not free a communicator whose abandoned collective a peer may still address.
std::vector<std::shared_ptr<void>>& kept() {
  static std::vector<std::shared_ptr<void>> objects;
  return objects;
}

struct Run {
  std::shared_ptr<Communicator> world;
  shardopt_test::SeededParams params{kSizes, 3};
  std::unique_ptr<ZeroOptimizer> opt;
  std::unique_ptr<PostLocalSGDOptimizer> plsgd;
  std::unique_ptr<ModelAverager> averager;
};

Outcome run(const Scenario& s) {
  auto kept_run = std::make_shared<Run>();
  kept().push_back(kept_run);
  Run& r = *kept_run;
  r.world = world()->split(0, world()->rank());  // a scenario's own communicators
  const int rank = r.world->rank();
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.stage = s.stage;
  config.overlap = s.overlap;
  config.bucket_bytes = 64 * 4;
  r.opt = std::make_unique<ZeroOptimizer>(r.world->split(rank / s.replica_size, rank), config,
                                          std::vector<ParamGroupSpec>{r.params.all()});
  if (s.post_local_sgd) {
    r.plsgd = std::make_unique<PostLocalSGDOptimizer>(r.world, *r.opt, s.averager);
  } else {
    r.averager = std::make_unique<ModelAverager>(r.world, *r.opt, s.averager);
  }
  Outcome out;
  try {
    const int steps = rank == s.joined_rank ? s.joins_after : kSteps;
    for (int t = 0; t < steps; ++t) {
      for (ParamId id = 0; id < r.opt->num_params(); ++id) {
        std::vector<float> g = shardopt_test::seeded_values(
            100u + 13u * static_cast<uint32_t>(rank + 5 * t) + static_cast<uint32_t>(id), kSizes[static_cast<std::size_t>(id)], 0.5f);
        if (s.stage == 1) {
          std::memcpy(r.opt->grad_view(id).data, g.data(), g.size() * sizeof(float));
          if (s.overlap != OverlapPolicy::off) r.opt->grad_ready(id);
        } else if (r.plsgd) {
          r.plsgd->reduce_gradient(id, TensorRef{g.data(), static_cast<int64_t>(g.size())});
        } else {
          r.opt->reduce_gradient(id, TensorRef{g.data(), static_cast<int64_t>(g.size())});
        }
      }
      if (r.plsgd) {
        r.plsgd->reduce_gradients();
        r.plsgd->step();
      } else {
        r.opt->reduce_gradients();
        r.opt->step();
        r.averager->average_parameters();
      }
    }
    if (rank == s.joined_rank || s.everyone_joins) r.opt->join();
  } catch (const Error& e) {
    out.raised = true;
    out.code = e.code();
    out.message = e.what();
  }
  return out;
}

// Every rank of the world raised Error(unsupported) naming Join, model averaging and the rank
// that called join(): none timed out, none went on (a rank left waiting would raise
// Error(timeout) after the world's 5 s).
void check_refused_everywhere(const Scenario& s) {
  if (world()->size() % s.replica_size != 0 || s.joined_rank >= world()->size()) return;
  const Outcome out = run(s);
  INFO("rank " << world()->rank() << ": " << out.message);
  REQUIRE(out.raised);
  CHECK(out.code != ErrorCode::timeout);
  CHECK(out.code == ErrorCode::unsupported);
  // A rank that called join() itself raises its own refusal; the others the first one's.
  const int named = s.everyone_joins ? world()->rank() : s.joined_rank;
  CHECK_THAT(out.message,
             Catch::Contains("Join does not combine with model averaging (rank " + std::to_string(named) + " called join())"));
}

}  // namespace

TEST_CASE("join() under post-local SGD over one-rank replicas is refused on every rank", "[join][averaging]") {
  Scenario s;
  SECTION("after warmup, averaging every 2 steps") {}
  SECTION("a local step before the averaging") { s.averager = periodic_averager(3); }
  SECTION("in warmup: gradients averaged over the world") { s.averager = periodic_averager(2, 4); }
  SECTION("stage 2 in warmup") {
    s.stage = 2;
    s.averager = periodic_averager(2, 4);
  }
  SECTION("the outer optimizer") { s.averager.outer.enabled = true; }
  SECTION("the last rank joins") { s.joined_rank = world()->size() - 1; }
  SECTION("an overlapped optimizer") { s.overlap = OverlapPolicy::after_backward; }
  SECTION("per_bucket, the outer optimizer") {
    s.overlap = OverlapPolicy::per_bucket;
    s.averager.outer.enabled = true;
  }
  SECTION("every rank joins in the end, before the next averaging") {
    s.averager = periodic_averager(8);
    s.everyone_joins = true;
  }
  check_refused_everywhere(s);
}

TEST_CASE("join() under post-local SGD over two-rank replicas is refused on every rank", "[join][averaging]") {
  Scenario s;
  s.replica_size = 2;
  s.averager = periodic_averager(2, 1);
  SECTION("after warmup") {}
  SECTION("in warmup") { s.averager = periodic_averager(2, 4); }
  SECTION("stage 2 in warmup") {
    s.stage = 2;
    s.averager = periodic_averager(2, 4);
  }
  SECTION("stage 2 after warmup") { s.stage = 2; }
  SECTION("the outer optimizer") { s.averager.outer.enabled = true; }
  SECTION("the second rank of a replica joins") { s.joined_rank = 1; }
  SECTION("a local step before the averaging") { s.averager = periodic_averager(3); }
  check_refused_everywhere(s);
}

TEST_CASE("join() beside a ModelAverager the trainer drives is refused on every rank", "[join][averaging]") {
  Scenario s;
  s.post_local_sgd = false;
  SECTION("one-rank replicas") {}
  SECTION("two-rank replicas") { s.replica_size = 2; }
  SECTION("two-rank replicas, the outer optimizer") {
    s.replica_size = 2;
    s.averager.outer.enabled = true;
  }
  check_refused_everywhere(s);
}

TEST_CASE("join() under hierarchical averaging is refused on every rank", "[join][averaging]") {
  if (world()->size() != 4) return;
  Scenario s;
  s.averager = hierarchical_averager({{2, 2}, {4, 4}});
  SECTION("one-rank replicas") {}
  SECTION("two-rank replicas") { s.replica_size = 2; }
  SECTION("a rank of the other group joins") { s.joined_rank = 3; }
  SECTION("the world's averaging comes before the group's") { s.joins_after = 3; }
  SECTION("in warmup, two-rank replicas") {
    s.replica_size = 2;
    s.averager = hierarchical_averager({{2, 2}, {4, 4}}, 3);
  }
  check_refused_everywhere(s);
}

TEST_CASE("a refusal on one replica in the averaging's agreement reaches the ranks of every replica",
          "[averaging][agreement]") {
  if (world()->size() < 2) return;
  const int replica_size = GENERATE(1, 2);
  if (world()->size() % replica_size != 0 || world()->size() / replica_size < 2) return;
  auto kept_run = std::make_shared<Run>();
  kept().push_back(kept_run);
  Run& r = *kept_run;
  r.world = world()->split(0, world()->rank());
  const int rank = r.world->rank();
  OptimizerConfig config;
  config.stage = 2;
  r.opt = std::make_unique<ZeroOptimizer>(r.world->split(rank / replica_size, rank), config,
                                          std::vector<ParamGroupSpec>{r.params.all()});
  r.averager = std::make_unique<ModelAverager>(r.world, *r.opt, periodic_averager(1));
  // The first replica opens a gradient round and averages inside it: its gate refuses. The
  // other replicas' ranks learn it in the agreement over the partners of their shard, where
  // they would otherwise wait for the first replica until the timeout.
  std::vector<float> g = shardopt_test::seeded_values(9u, kSizes[0]);
  if (rank / replica_size == 0) r.opt->reduce_gradient(0, TensorRef{g.data(), kSizes[0]});
  const auto [code, message] = shardopt_test::error_of([&] { r.averager->average_parameters(); });
  INFO("rank " << rank << ": " << message);
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("average_parameters") &&
                          Catch::Contains("gradients were handed with grad_ready()/reduce_gradient()"));
}

int main(int argc, char** argv) {
  CommOptions options;
  options.timeout_seconds = 5;  // inherited by every split: a rank left waiting fails in seconds
  world() = mpi_world(options);
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  world()->all_reduce(&worst, 1, DType::f32, ReduceOp::max);
  kept().clear();
  world().reset();
  return worst > 0 ? 1 : 0;
}
