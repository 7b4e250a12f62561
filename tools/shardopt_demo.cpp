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
// --local-sgd SPEC adds a third run, local SGD: PostLocalSGDOptimizer over one ZeroOptimizer
// per replica (replica=N consecutive world ranks, state sharded among them; default 1, each
// rank its own replica), on the same data (each rank its own batch) for the same number of
// steps. Rank 0 then prints, for the synchronous run (sharded if it ran, else replicated) and
// for local SGD, the bytes it communicated (total and per step) and the final loss, and the
// ratio of the bytes per step. What is counted, over the steps only (not the construction,
// --resume or --save):
//  - bytes: the payload rank 0 handed to collectives of more than one rank, its own
//    contribution: all_reduce/reduce/all_gather `count` elements, reduce_scatter its whole send
//    buffer, a broadcast on its root only; f32/bf16/f16 only (the byte-typed agreement records
//    are control traffic), never barriers. This is also how communication() counts.
//  - synchronous: every such collective of the ZeroOptimizer over the world, counted by
//    wrapping the communicator it is given (demo/counting_comm): the gradient averaging (stage
//    1 all-reduce of the whole, padded, gradient buffer; stage 2 one reduce per owner) and the
//    parameter sync. On one machine the ranks share the parameter buffer, so the sync is a
//    barrier and adds nothing; across nodes it is a broadcast of each rank's shard.
//  - local SGD: PostLocalSGDOptimizer::communication() gradient_bytes (the gradients averaged
//    across the replicas in warmup, and the replica's own gradient reduction when replica > 1,
//    as its trainable elements) + averaging_bytes (each rank's shard, as f32, at every
//    averaging), plus replica_bytes: what the replica's ZeroOptimizer hands to collectives
//    outside the gradient calls (its parameter sync, also after each averaging; clipping),
//    counted as for the synchronous run; 0 with replica=1. cross_replica_bytes: what the
//    demo counted on the world communicator the averager was given (and the groups it split
//    from it): the part of bytes that crossed replicas, i.e. all but the replica's own.
//  - final_loss: the last step's loss (MSE on the rank's own batch, computed before that
//    step's update), the mean over all ranks. With local SGD each rank's loss is that of its
//    replica's model, which between averagings fits that replica's batches only.
//
// --overlap after-backward|per-bucket adds one more run of the first mode with
// OptimizerConfig::overlap: the backward hands each layer's gradients over as soon as they
// exist (grad_ready at stage 1, reduce_gradient at stage 2), reductions run on the optimizer's
// communication thread meanwhile, step() returns with the all-gathers queued and the next
// forward waits per layer (wait_param) just before using it. Its params_sum must be bitwise
// the plain run's (Error(mismatch) otherwise), and rank 0 prints, for both, the median per
// iteration of the time spent inside shardopt calls (what the trainer sees of the optimizer)
// and of the whole iteration (forward/backward and those calls; the communication thread
// shares the cores with the compute, which the visible time alone does not show).
//
// This file is main: it parses the command line, runs the chosen modes and prints rank 0's
// lines. The pieces live in tools/demo/: options (command line), data (seeded parameters and
// batches), params (their registration), mlp (forward/backward), train (one mode's run),
// counting_comm (the byte counts), measure (peak RSS, median) and gradcheck
// (--check-gradients).
#include <cblas.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "demo/gradcheck.hpp"
#include "demo/options.hpp"
#include "demo/train.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using shardopt::Communicator;
using shardopt_demo::ModeResult;
using shardopt_demo::Options;
using shardopt_demo::RunKind;
using shardopt_demo::RunModes;
using shardopt_demo::UsageError;

// The three --local-sgd lines (see the comment at the top for what they count).
void print_local_sgd(const Options& options, RunKind sync_kind, const ModeResult& sync, const ModeResult& local) {
  const double sync_per_step = static_cast<double>(sync.comm_bytes) / sync.steps;
  const double local_per_step = static_cast<double>(local.comm_bytes) / local.steps;
  std::printf("sync: mode=%s steps=%d bytes=%" PRId64 " bytes_per_step=%.1f final_loss=%.6e\n",
              shardopt_demo::run_kind_name(sync_kind), sync.steps, sync.comm_bytes, sync_per_step,
              sync.final_loss);
  std::printf("local_sgd: spec=%s replicas=%d steps=%d averages=%" PRId64 " gradient_bytes=%" PRId64
              " averaging_bytes=%" PRId64 " replica_bytes=%" PRId64 " bytes=%" PRId64
              " bytes_per_step=%.1f cross_replica_bytes=%" PRId64 " final_loss=%.6e step_ms_median=%.3f\n",
              options.local_sgd.spec.c_str(), local.replicas, local.steps, local.local.averages,
              local.local.gradient_bytes, local.local.averaging_bytes, local.replica_bytes, local.comm_bytes,
              local_per_step, local.world_counted_bytes, local.final_loss, local.step_ms_median);
  if (options.verbose) {
    // Cross-check: the replica's own gradient reduction as the demo counted it (the whole,
    // padded, buffer), which communication() counts inside gradient_bytes (trainable elements).
    std::printf("local_sgd counted: replica_gradient_bytes=%" PRId64 "\n", local.replica_gradient_bytes);
  }
  // No bytes at all (one rank) has no ratio.
  if (local.comm_bytes > 0) {
    std::printf("bytes_ratio=%.6f (sync/local_sgd, per step)\n", sync_per_step / local_per_step);
  } else {
    std::printf("bytes_ratio=none (local_sgd communicated nothing)\n");
  }
  std::fflush(stdout);
}

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

  if (options.local_sgd.enabled && comm->size() % options.local_sgd.replica != 0) {
    if (rank == 0) {
      std::fprintf(stderr, "shardopt-demo: --local-sgd replica=%d must divide the world size %d\n",
                   options.local_sgd.replica, comm->size());
    }
    return 2;
  }

  std::vector<RunKind> kinds;
  if (options.modes != RunModes::replicated) kinds.push_back(RunKind::sharded);
  if (options.modes != RunModes::sharded) kinds.push_back(RunKind::replicated);

  const auto print_mode = [&](const std::string& name, const ModeResult& r) {
    if (rank != 0) return;
    std::printf("mode=%s world=%d params=%" PRId64 " dtype=%s stage=%d state_bytes=%" PRId64
                " grad_bytes=%" PRId64 " peak_rss_mb=%.1f step_ms_median=%.3f params_sum=%.9e\n",
                name.c_str(), comm->size(), r.params, shardopt::dtype_name(options.dtype), r.stage,
                r.state_bytes, r.grad_bytes, r.peak_rss_mb, r.step_ms_median, r.params_sum);
    std::fflush(stdout);
  };
  std::vector<ModeResult> results;
  for (const RunKind kind : kinds) {
    results.push_back(shardopt_demo::train(comm, options, kind));
    print_mode(shardopt_demo::run_kind_name(kind), results.back());
  }

  int status = 0;
  if (results.size() == 2) {
    // The sharded step must reproduce the replicated one bit for bit, so compare the bytes.
    const bool match = std::memcmp(&results[0].params_sum, &results[1].params_sum, sizeof(double)) == 0;
    if (rank == 0) std::printf("params_sum_match=%s\n", match ? "yes" : "no");
    status = match ? 0 : 1;
  }
  if (options.overlap != shardopt::OverlapPolicy::off) {
    // The first mode again, overlapped: the same bits, and the optimizer time the trainer sees.
    const ModeResult& plain = results.front();
    const ModeResult overlapped = shardopt_demo::train(comm, options, kinds.front(), true);
    print_mode(std::string(shardopt_demo::run_kind_name(kinds.front())) + "_overlap", overlapped);
    const bool match = std::memcmp(&plain.params_sum, &overlapped.params_sum, sizeof(double)) == 0;
    if (rank == 0) {
      std::printf("overlap: policy=%s visible_ms_median plain=%.3f overlap=%.3f ratio=%.3f"
                  " iter_ms_median plain=%.3f overlap=%.3f ratio=%.3f params_sum_match=%s\n",
                  shardopt::overlap_policy_name(options.overlap), plain.visible_ms_median,
                  overlapped.visible_ms_median, overlapped.visible_ms_median / plain.visible_ms_median,
                  plain.iter_ms_median, overlapped.iter_ms_median,
                  overlapped.iter_ms_median / plain.iter_ms_median, match ? "yes" : "no");
      std::fflush(stdout);
    }
    if (!match) {
      // Every rank computed both sums (the final check made them agree), so all fail together.
      throw shardopt::Error(shardopt::ErrorCode::mismatch,
                            "the overlapped run's params_sum differs from the plain run's (mode=" +
                                std::string(shardopt_demo::run_kind_name(kinds.front())) + ")");
    }
  }
  if (options.local_sgd.enabled) {
    const ModeResult local = shardopt_demo::train(comm, options, RunKind::local_sgd);
    if (rank == 0) print_local_sgd(options, kinds.front(), results.front(), local);
  }
  return status;
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
