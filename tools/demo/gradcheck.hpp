// tools/demo/gradcheck.hpp — shardopt-demo --check-gradients: the BLAS backward pass against finite differences.
#pragma once

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

// Compares the BLAS backward pass with central differences of the double-precision reference
// loss. The error of one element is |analytic - numeric| / max(|analytic|, |numeric|, floor),
// where floor = 1e-3 * the largest numeric gradient keeps near-zero gradients (dominated by
// float rounding) from dominating. Returns the process exit status.
int check_gradients(shardopt::Communicator& comm, const Options& options);

}  // namespace shardopt_demo
