// bench/src/cuda_step.hpp — the full optimizer step on CUDA parameters, timed against the device-to-device bandwidth measured in the same run (--mode step --device cuda).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model.hpp"

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// The synthetic values of the whole model (`params`: parameters, else gradients) into device
// memory at `device_base` (one element of o.dtype per model element), a tensor at a time
// through host memory.
void upload_model_values(void* device_base, const Model& model, const Options& o, bool params);

// A device view's values into `scratch`, as a host TensorRef.
shardopt::TensorRef read_to_host(const shardopt::TensorRef& view, std::vector<uint32_t>& scratch);

// The synthetic gradients of the tensors registered as ids 0, 1, ... (by_id[i] is id i) into
// the optimizer's device grad views.
void upload_grad_views(shardopt::ZeroOptimizer& opt, const std::vector<Tensor>& by_id, const Options& o);

struct CudaTiming {
  double step_s = 0;   // host time with the device drained on both sides
  double event_s = 0;  // CUDA events on the optimizer's stream
};

// -w untimed steps, then -n steps each timed as below (run_cuda_step); medians of the slowest
// rank's times.
CudaTiming time_cuda_steps(shardopt::Communicator& host, shardopt::ZeroOptimizer& opt, int warmup, int iters);

// A GPU's name as one token of the key=value line.
std::string token(std::string text);

// One ZeroOptimizer over `device_comm` (NCCL, or MPI at one rank / CUDA-aware) on the current
// CUDA device, the model of make_model with its synthetic values: the parameters are
// registered as cudaMalloc'd buffers holding them (bucket view copies them into its own flat
// buffer; external storage steps them in place), the gradients live on the device (bucket
// view: its grad views; external: a cudaMalloc'd buffer).
//
// -w untimed steps, then -n steps each timed as
//   cudaDeviceSynchronize; barrier; t0; event on cuda_stream(); step(); event; cudaDeviceSynchronize; t1; barrier
// step_ms_median is the median over the steps of the slowest rank's t1 - t0 (what a trainer
// that waits for its step sees); gpu_event_ms_median the same of the events' time.
//
// The roofline: the bytes each rank's step must move in its own device memory (roofline.hpp:
// the update's streams over its shard, plus 2 x sizeof(dtype) per element the sync brings in;
// the interconnect is not modelled, so across GPUs the bound is loose, never wrong) at the best
// device-to-device bandwidth that rank measured (cuda_device.hpp: cudaMemcpy, a copy kernel,
// Adam's streams), in two windows (before the model exists and after the timed steps), best
// of both. roofline_ms is the slowest rank's; step_over_roofline = step_ms / roofline_ms and
// roofline_fraction (its inverse) is judged as on the CPU: above 1.05 it is a measurement
// error; data that fit in twice the L2 cache are not judged.
//
// Afterwards the parameters are read back and checked as verify.hpp does: the same on every
// rank, and bitwise those of a single-rank CPU optimizer over this rank's slice of the model
// that took the same steps (the CUDA kernels promise bitwise parity with the CPU's, f32 and
// bf16/f16 with fp32 masters alike).
//
// `host` is the MPI communicator over the same ranks (timing, barriers, the check). Returns the
// exit status: 1 when any parameter was wrong, else 3 for a measurement error, else 0.
int run_cuda_step(const std::shared_ptr<shardopt::Communicator>& host,
                  const std::shared_ptr<shardopt::Communicator>& device_comm, const Options& o);

}  // namespace shardopt_bench
