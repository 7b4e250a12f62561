// bench/src/cuda_run.cpp — the device check every rank agrees on, the GPU and communicator of each rank, and the dispatch of --device cuda to the collectives, step or Muon step mode.
#include "cuda_run.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "cuda_device.hpp"
#include "cuda_muon_step.hpp"
#include "cuda_step.hpp"
#include "shardopt/nccl.hpp"
#include "support.hpp"

namespace shardopt_bench {

namespace {

// Why this rank cannot run --device cuda with these options; empty when it can.
std::string unusable_reason(const Options& o) {
  std::string reason = cuda_unusable_reason();
  if (reason.empty() && o.comm == DeviceComm::nccl && !shardopt::nccl_compiled_in()) {
    reason = "this build of shardopt has no NCCL communicator (use --comm mpi, or build it with NCCL)";
  }
  return reason;
}

// Ranks before this one on its node (by host name).
int node_local_rank(Communicator& host) {
  const std::vector<int64_t> nodes = gather_int64(host, node_id());
  int local = 0;
  for (int r = 0; r < host.rank(); ++r) local += nodes[static_cast<std::size_t>(r)] == nodes[static_cast<std::size_t>(host.rank())] ? 1 : 0;
  return local;
}

// One line on rank 0 for a run that cannot start; every rank returns the same status.
int cannot_run(const Communicator& host, const std::string& why) {
  if (host.rank() == 0) std::fprintf(stderr, "shardopt-bench: --device cuda: %s\n", why.c_str());
  return kNoDeviceExit;
}

}  // namespace

int run_on_cuda(const std::shared_ptr<Communicator>& host, const Options& o) {
  const std::string reason = unusable_reason(o);
  const std::vector<int64_t> unusable = gather_int64(*host, reason.empty() ? 0 : 1);
  for (int r = 0; r < host->size(); ++r) {
    if (unusable[static_cast<std::size_t>(r)] == 0) continue;
    // Rank 0 prints its own reason; another rank's is named by its number.
    return cannot_run(*host, r == 0 ? reason : "rank " + std::to_string(r) + " has no usable CUDA device or NCCL");
  }

  std::shared_ptr<Communicator> tested;
  if (o.comm == DeviceComm::nccl) {
    try {
      // Every rank raises alike when NCCL cannot be set up (a missing libnccl.so.2, no device).
      tested = shardopt::nccl_world();
    } catch (const shardopt::Error& e) {
      if (e.code() != shardopt::ErrorCode::unsupported) throw;
      return cannot_run(*host, e.what());
    }
  } else {
    use_local_device(node_local_rank(*host));
    tested = host;
  }
  if (o.mode == BenchMode::step) {
    return o.algorithm == Algorithm::muon ? run_cuda_muon_step(host, tested, o) : run_cuda_step(host, tested, o);
  }
  if (!tested->cuda_aware()) {
    return cannot_run(*host, "the " + std::string(tested->backend_name()) + " communicator does not take device buffers (not CUDA-aware); use --comm nccl");
  }
  return run_collectives(*host, *tested, o);
}

}  // namespace shardopt_bench
