// tests/mpi/test_mismatched_calls.cpp — ranks in different collectives get an Error on every rank (never an abort of the job) and the failed communicator refuses later calls at once.
//
// The last rank calls barrier() on the optimizer's communicator directly while the others run
// an optimizer call. MPI then matches the barrier's messages with the call's agreement
// (Open MPI fails the barrier with MPI_ERR_TRUNCATE and reports it on MPI_COMM_WORLD, whose
// handler aborts the job unless shardopt keeps it from being invoked).
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::world;

namespace {

constexpr double kTimeoutSeconds = 2.0;

struct Outcome {
  bool raised = false;
  ErrorCode code = ErrorCode::internal;
  std::string what;
};

Outcome outcome_of(const std::function<void()>& call) {
  Outcome o;
  try {
    call();
  } catch (const Error& e) {
    o.raised = true;
    o.code = e.code();
    o.what = e.what();
  }
  return o;
}

std::string checkpoint_dir() {
  // The same path on every rank (the test world shares a file system).
  static const std::string dir = [] {
    std::string name = "shardopt-mismatch-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    world()->broadcast(name.data(), static_cast<int64_t>(name.size()), DType::byte, 0);
    return (std::filesystem::temp_directory_path() / name).string();
  }();
  return dir;
}

// Runs `call` on every rank but the last, which calls barrier() on the same communicator.
void check_mismatched(const char* operation, const std::function<void(ZeroOptimizer&)>& call) {
  CommOptions options;
  options.timeout_seconds = kTimeoutSeconds;
  std::shared_ptr<Communicator> comm = mpi_world(options);
  shardopt_test::SeededParams params({{"w", 1000}, {"b", 24}});
  OptimizerConfig config;
  config.node_shared_params = false;  // the sync is a collective the barrier can meet
  auto opt = std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{params.all()});
  shardopt_test::write_seeded_grads(*opt, 3);
  opt->save(checkpoint_dir());  // what load() reads

  const bool in_barrier = comm->rank() == comm->size() - 1;
  const auto start = std::chrono::steady_clock::now();
  const Outcome first = outcome_of([&] {
    if (in_barrier) {
      comm->barrier();
    } else {
      call(*opt);
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(operation << " on rank " << comm->rank() << ": " << first.what);
  REQUIRE(first.raised);
  // Within the watchdog's timeout plus scheduling slack, never a hang.
  REQUIRE(seconds < kTimeoutSeconds + 3.0);
  if (in_barrier) {
    // MPI fails the barrier (its messages were truncated by the call's), or it waits alone.
    REQUIRE((first.code == ErrorCode::comm || first.code == ErrorCode::timeout));
    REQUIRE_THAT(first.what, Catch::Contains("barrier on rank"));
  } else {
    // The call's agreement either saw the barrier's traffic instead of a record (a mismatch
    // naming another collective) or never completed (a timeout naming the call).
    REQUIRE((first.code == ErrorCode::mismatch || first.code == ErrorCode::timeout ||
             first.code == ErrorCode::comm));
    REQUIRE_THAT(first.what, Catch::Contains(operation));
    if (first.code == ErrorCode::mismatch) {
      REQUIRE_THAT(first.what, Catch::Contains("is in another collective (it sent no agreement record"));
    }
  }
  // A rank whose collective failed in MPI or timed out holds a poisoned communicator: the next
  // call fails at once with the same kind of error, naming the failure.
  if (first.code == ErrorCode::comm || first.code == ErrorCode::timeout) {
    const auto again = std::chrono::steady_clock::now();
    const Outcome second = outcome_of([&] { comm->barrier(); });
    REQUIRE(second.raised);
    REQUIRE(second.code == first.code);
    REQUIRE_THAT(second.what, Catch::Contains("communicator is unusable since an earlier collective"));
    REQUIRE(std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count() < 0.5);
  }
  opt.reset();
  // The caller's MPI_COMM_WORLD handler is untouched: still MPI's fatal default.
  MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
  REQUIRE(handler == MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&handler);
  // Every rank is done with the poisoned communicator before the next case starts.
  world()->barrier();
}

}  // namespace

TEST_CASE("a rank in a direct barrier while the others are in an optimizer call: errors, no abort",
          "[mismatch]") {
  if (world()->size() < 2) return;  // needs a peer in another call
  check_mismatched("reduce_gradients", [](ZeroOptimizer& o) { o.reduce_gradients(); });
  check_mismatched("step", [](ZeroOptimizer& o) { o.step(); });
  check_mismatched("clip_grad_norm", [](ZeroOptimizer& o) { o.clip_grad_norm(1.0); });
  check_mismatched("save", [](ZeroOptimizer& o) { o.save(checkpoint_dir() + "-other"); });
  check_mismatched("load", [](ZeroOptimizer& o) { o.load(checkpoint_dir()); });
  check_mismatched("consolidate_state_dict", [](ZeroOptimizer& o) { o.consolidate_state_dict(0); });
  world()->barrier();
  if (world()->rank() == 0) {
    std::filesystem::remove_all(checkpoint_dir());
    std::filesystem::remove_all(checkpoint_dir() + "-other");
  }
}
