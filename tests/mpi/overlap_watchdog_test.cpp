// tests/mpi/overlap_watchdog_test.cpp — with config.overlap, a bucket reduction a peer never joins in time becomes Error(timeout) on the caller (never a hang), and later calls fail at once.
//
// The timed-out all-reduce stays live in MPI and may complete only inside MPI_Finalize, after
// the optimizer is gone: its gradient buffer must stay allocated until then, which the
// AddressSanitizer build checks (core/abandoned_memory.hpp).
//
// Rank 1 is late on purpose (it sleeps past rank 0's timeout), so this runs as a plain
// program at exactly 2 ranks rather than inside the Catch2 runner, as watchdog_test does.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <typename Call>
double expect_timeout(const char* what, const std::vector<std::string>& parts, const Call& call) {
  const auto start = Clock::now();
  try {
    call();
    expect(false, std::string(what) + " returned although rank 1 was late");
  } catch (const shardopt::Error& e) {
    bool named = e.code() == shardopt::ErrorCode::timeout;
    for (const std::string& part : parts) named = named && contains(e.what(), part);
    expect(named, std::string(what) + ": unexpected error: " + e.what());
    std::printf("rank 0, %s: %s\n", what, e.what());
  }
  return seconds_since(start);
}

void write_grad(shardopt::ZeroOptimizer& opt, shardopt::ParamId id, float value) {
  const shardopt::TensorRef g = opt.grad_view(id);
  for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = value;
}

}  // namespace

int main() {
  constexpr double kTimeout = 2.0;
  shardopt::CommOptions options;
  options.timeout_seconds = kTimeout;
  auto comm = shardopt::mpi_world(options);
  if (comm->size() != 2) {
    std::fprintf(stderr, "overlap watchdog test needs exactly 2 ranks\n");
    return 1;
  }
  {
    // Three params of exactly one 64-element bucket each (flat, 2 ranks: no padding).
    std::vector<std::vector<float>> values(3, std::vector<float>(64, 0.5f));
    shardopt::ParamGroupSpec group;
    for (int i = 0; i < 3; ++i) {
      shardopt::ParamSpec p;
      p.name = "p" + std::to_string(i);
      p.param = shardopt::TensorRef{values[static_cast<std::size_t>(i)].data(), 64};
      group.params.push_back(p);
    }
    shardopt::OptimizerConfig config;
    config.bucket_bytes = 256;
    config.node_shared_params = false;
    config.overlap = shardopt::OverlapPolicy::after_backward;
    shardopt::ZeroOptimizer opt(comm, config, {group});
    expect(opt.num_buckets() == 3, "three buckets, got " + std::to_string(opt.num_buckets()));

    // Round 1, both ranks: the order 2, 1, 0 is learned.
    for (int id = 2; id >= 0; --id) {
      write_grad(opt, id, 0.25f);
      opt.grad_ready(id);
    }
    opt.reduce_gradients();
    opt.step();
    opt.wait_all();

    // Round 2: both hand p2 (bucket 2 is reduced); then rank 1 goes missing.
    write_grad(opt, 2, 0.25f);
    opt.grad_ready(2);
    if (comm->rank() == 0) {
      // Bucket 1's all-reduce is queued on the communication thread and times out there; the
      // caller learns it from the call that waits for it, within about the timeout.
      write_grad(opt, 1, 0.25f);
      opt.grad_ready(1);
      write_grad(opt, 0, 0.25f);
      opt.grad_ready(0);
      const double waited = expect_timeout("reduce_gradients", {"reduce_gradients", "did not complete within 2 s"},
                                           [&] { opt.reduce_gradients(); });
      expect(waited < kTimeout + 1.5, "reduce_gradients raised after " + std::to_string(waited) + " s");
      // Poisoned: the next collective call fails at once, naming the collective that timed out.
      const double again =
          expect_timeout("reduce_gradients again", {"did not complete within 2 s"}, [&] { opt.reduce_gradients(); });
      expect(again < 0.5, "the call after the timeout took " + std::to_string(again) + " s");
      // The local waits return: the last step's gathers had landed.
      opt.wait_all();
      opt.wait_param(0);
    } else {
      // Late by well over the timeout; then hands p1, whose bucket's all-reduce matches the one
      // rank 0 started, so that its request completes and both processes can finalise MPI. The
      // next bucket in the learned order (0) is not complete here, so nothing more is issued.
      std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 1.5));
      write_grad(opt, 1, 0.25f);
      opt.grad_ready(1);
      opt.wait_all();
    }
  }
  std::printf("rank %d: %s\n", comm->rank(), failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
