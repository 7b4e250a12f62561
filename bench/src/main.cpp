// bench/src/main.cpp — shardopt-bench: nccl-tests-style sweeps of shardopt's collectives, and the full optimizer step timed against a memory roofline measured in the same run.
//
// Run under mpirun. Three modes:
//
//  collectives  One table per collective (all_gather, broadcast, reduce_scatter, all_reduce)
//               over a size sweep, with nccl-tests' columns: size, count, time, algbw, busbw,
//               #wrong. Every timed iteration refills its inputs and checks every element of
//               the result (-c 1), so a collective that moves the wrong bytes cannot look fast.
//
//  step         One ZeroOptimizer over a few big params (f32, or bf16/f16 with fp32 masters),
//               the full step() timed between barriers (median over -n iterations of the
//               slowest rank) with its phases (agreement, update, sync) read from the same
//               steps, then compared with a roofline from memory bandwidths measured in the
//               same run: STREAM's copy and triad plus a kernel with the update rule's own
//               access pattern, over arrays far larger than the last-level cache (read from
//               sysfs), with the same threads per rank and every rank streaming at once (they
//               share the memory bus). A fraction of that roofline above 1.05 is reported as
//               a measurement error, not as a result. Afterwards every rank checks that it
//               holds the same parameters as every other rank and as a single-rank reference
//               optimizer that took the same steps.
//
//  iteration    reduce_gradients() then step(), each timed, against their rooflines from
//               bandwidth probes interleaved with the timed iterations (iteration.hpp).
//
//  checkpoint   The step time a checkpoint costs: rounds of steps with no save, with a
//               blocking save() and with save_async() + wait_save(), each call timed on its
//               slowest rank (checkpoint_cost.hpp).
//
// --device cuda runs the collectives on device buffers (NCCL over MPI, or a CUDA-aware MPI) and
// the step on CUDA parameters against the device-to-device bandwidth (cuda_run, cuda_step).
//
// One job per file beside this one: options (flags), support.hpp (timing and MPI helpers),
// collectives (the sweep), model (the model and its synthetic values), cache (the last-level
// cache), stream (bandwidths), roofline (bytes the step must move, the verdict), verify (the
// self-check), step (the step mode), muon_step (the Muon step), checkpoint_cost (the checkpoint mode), cuda_run (the device
// check and dispatch), cuda_step (the step on a GPU), cuda_device (CUDA runtime calls: device
// memory, events, bandwidth kernels; cuda_unavailable in a build without CUDA).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>

#include "cache.hpp"
#include "checkpoint_cost.hpp"
#include "collectives.hpp"
#include "cuda_run.hpp"
#include "iteration.hpp"
#include "muon_step.hpp"
#include "options.hpp"
#include "step.hpp"
#include "support.hpp"
#include "shardopt/shardopt.hpp"

using shardopt::Communicator;
using shardopt_bench::BenchMode;
using shardopt_bench::Options;

int main(int argc, char** argv) {
  std::shared_ptr<Communicator> comm;
  try {
    comm = shardopt::mpi_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-bench: error: %s\n", e.what());
    return 1;
  }
  const bool leader = comm->rank() == 0;
  Options options;
  try {
    options = shardopt_bench::parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    // Every rank parsed the same arguments and fails the same way; one of them says so.
    if (leader) std::fprintf(stderr, "shardopt-bench: error: %s\n\n%s", e.what(), shardopt_bench::usage_text);
    return 2;
  }
  if (options.help) {
    if (leader) std::fputs(shardopt_bench::usage_text, stdout);
    return 0;
  }
  // mpirun binds each rank to one core by default when it starts 2 ranks or fewer: threads
  // beyond the rank's CPUs share them, and the run measures fewer threads than it says.
  const int threads = std::max(shardopt_bench::effective_threads(options.threads), options.blas_threads);
  const int cpus = shardopt_bench::affinity_cpu_count();
  if (options.device != shardopt_bench::BenchDevice::cuda && cpus > 0 && threads > cpus) {
    std::fprintf(stderr,
                 "shardopt-bench: warning: rank %d runs %d threads on the %d CPU(s) of its affinity mask, which they "
                 "share (mpirun: --bind-to none, or --map-by slot:PE=%d)\n",
                 comm->rank(), threads, cpus, threads);
  }
  try {
    if (options.device == shardopt_bench::BenchDevice::cuda) return shardopt_bench::run_on_cuda(comm, options);
    switch (options.mode) {
      case BenchMode::collectives: return shardopt_bench::run_collectives(*comm, options);
      case BenchMode::step:
        if (options.algorithm == shardopt::Algorithm::muon) return shardopt_bench::run_muon_step(comm, options);
        return shardopt_bench::run_step(comm, options);
      case BenchMode::checkpoint: return shardopt_bench::run_checkpoint_cost(comm, options);
      case BenchMode::iteration: return shardopt_bench::run_iteration(comm, options);
    }
    return 2;
  } catch (const std::invalid_argument& e) {
    if (leader) std::fprintf(stderr, "shardopt-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-bench: error on rank %d: %s\n", comm->rank(), e.what());
    return 1;
  }
}
