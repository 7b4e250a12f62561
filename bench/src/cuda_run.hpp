// bench/src/cuda_run.hpp — --device cuda: checks every rank can run it, picks each rank's GPU and the communicator under test, and runs the collectives or the step mode there.
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// Collective over `host` (the MPI world). When any rank cannot run on a CUDA device (a build
// without CUDA, no usable device, NCCL missing for --comm nccl) rank 0 prints one line saying
// why and every rank returns kNoDeviceExit (cuda_device.hpp). Otherwise each rank takes its
// node-local GPU (NCCL picks it; --comm mpi: node-local rank % devices) and runs
// run_collectives or run_cuda_step; returns their exit status.
int run_on_cuda(const std::shared_ptr<shardopt::Communicator>& host, const Options& o);

}  // namespace shardopt_bench
