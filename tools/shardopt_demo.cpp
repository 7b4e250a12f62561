// tools/shardopt_demo.cpp — PyTorch's ZeroRedundancyOptimizer tutorial in C++: an MLP trained sharded vs replicated.
//
// Every rank builds the same MLP (same seed), feeds it its own random batch, runs a real
// forward/backward with OpenBLAS, averages gradients with reduce_gradients() and steps. The
// run is done twice, with the optimizer state sharded (ZeRO-1, or ZeRO-2 with --stage 2) and
// replicated (plain data parallel, always stage 1), and rank 0 prints one line per mode: state
// and gradient bytes, peak RSS, the median step time and the sum of all parameters, which must
// be bitwise the same in both modes.
//
// --dtype bf16|f16 registers 16-bit parameters and gradients (shardopt keeps fp32 masters of
// the local shard). The forward/backward stays f32: the demo keeps f32 working copies of the
// parameters, widened from param_view() after every step (outside the timed region), computes
// each layer's gradients in f32 and, as a backward hook would, narrows them into grad_view()
// (stage 1) or hands them with reduce_gradient() (stage 2), layer by layer in backward order.
// f16 runs with dynamic loss scaling: the gradients are multiplied by loss_scale() before they
// are narrowed, and a step whose gradients overflowed is skipped.
//
// This file is main: it parses the command line, runs the chosen modes and prints rank 0's
// lines. The pieces live in tools/demo/: options (command line), data (seeded parameters and
// batches), mlp (forward/backward), train (one mode's run), measure (peak RSS, median) and
// gradcheck (--check-gradients).
#include <cblas.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "demo/gradcheck.hpp"
#include "demo/options.hpp"
#include "demo/train.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using shardopt::Communicator;
using shardopt_demo::ModeResult;
using shardopt_demo::Options;
using shardopt_demo::RunModes;
using shardopt_demo::UsageError;

int run(int argc, char** argv) {
  std::shared_ptr<Communicator> comm = shardopt::mpi_world();
  const int rank = comm->rank();

  Options options;
  try {
    options = shardopt_demo::parse_options(argc, argv);
  } catch (const UsageError& e) {
    // Every rank sees the same command line and fails the same way; one message is enough.
    if (rank == 0) {
      std::fprintf(stderr, "shardopt-demo: %s\nusage: mpirun -np N shardopt-demo [options] (see --help)\n",
                   e.what());
    }
    return 2;
  }
  if (options.help) {
    if (rank == 0) std::fputs(shardopt_demo::usage_text, stdout);
    return 0;
  }

  // Ranks already run side by side on the cores; BLAS threads on top would oversubscribe them.
  openblas_set_num_threads(options.threads);

  if (options.check_gradients) return shardopt_demo::check_gradients(*comm, options);

  std::vector<bool> shard_states;
  if (options.modes != RunModes::replicated) shard_states.push_back(true);
  if (options.modes != RunModes::sharded) shard_states.push_back(false);

  std::vector<ModeResult> results;
  for (const bool shard_state : shard_states) {
    results.push_back(shardopt_demo::train(comm, options, shard_state));
    const ModeResult& r = results.back();
    if (rank == 0) {
      std::printf("mode=%s world=%d params=%" PRId64 " dtype=%s stage=%d state_bytes=%" PRId64
                  " grad_bytes=%" PRId64 " peak_rss_mb=%.1f step_ms_median=%.3f params_sum=%.9e\n",
                  shard_state ? "sharded" : "replicated", comm->size(), r.params,
                  shardopt::dtype_name(options.dtype), r.stage, r.state_bytes, r.grad_bytes,
                  r.peak_rss_mb, r.step_ms_median, r.params_sum);
      std::fflush(stdout);
    }
  }

  if (results.size() == 2) {
    // The sharded step must reproduce the replicated one bit for bit, so compare the bytes.
    const bool match = std::memcmp(&results[0].params_sum, &results[1].params_sum, sizeof(double)) == 0;
    if (rank == 0) std::printf("params_sum_match=%s\n", match ? "yes" : "no");
    return match ? 0 : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "shardopt-demo: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-demo: error: %s\n", e.what());
  }
  return 1;
}
