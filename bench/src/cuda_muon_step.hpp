// bench/src/cuda_muon_step.hpp — the Muon step on CUDA parameters (--mode step --device cuda --algorithm muon): cuBLAS Newton-Schulz timed and checked against the CPU's Muon.
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// The --layers x --width model on the current CUDA device, its L weights in one Muon group and
// its L biases in one AdamW group (as run_muon_step on the CPU), over `device_comm`. -w untimed
// steps, then -n steps timed as run_cuda_step times them (host time with the device drained on
// both sides, and CUDA events on cuda_stream()); ns_tflops_whole_step is the Newton-Schulz
// flops of the model (ns_steps x 6 width^3 per matrix) over the whole step's time, a lower
// bound of the products' own rate. No roofline: the step is bound by the products' flops.
//
// The check: each rank rebuilds one layer (layer = its rank) in a single-rank CPU optimizer,
// takes the same steps and compares: the matrix's largest |difference| is printed (cuBLAS and
// OpenBLAS order their sums differently, so Muon agrees within a tolerance, which
// tests/gpu/test_cuda_muon asserts) also in units of lr, and the bias (AdamW) must be bitwise
// equal. Prints one key=value line on rank 0; returns 1 when a bias differs or a parameter is
// not finite, else 0.
int run_cuda_muon_step(const std::shared_ptr<shardopt::Communicator>& host,
                       const std::shared_ptr<shardopt::Communicator>& device_comm, const Options& o);

}  // namespace shardopt_bench
