// tools/demo/data.hpp — shardopt-demo's deterministic parameters and batches, the same on every rank.
#pragma once

#include <cstdint>
#include <vector>

namespace shardopt_demo {

// nn.Linear's default initialisation: weight and bias uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)).
// Layer `layer` draws from its own streams, so every rank (and both modes) gets exactly the
// same values from the same seed without any communication.
void init_linear(uint64_t seed, int layer, int fan_in, float* weight, int64_t weight_numel,
                 float* bias, int64_t bias_numel);

// This rank's batch: inputs and targets ~ N(0, 1), different on every rank. The same batch is
// used at every step, so the loss (--verbose) visibly goes down as the model fits it.
void make_batch(uint64_t seed, int rank, std::vector<float>& input, std::vector<float>& target);

}  // namespace shardopt_demo
