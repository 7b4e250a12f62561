// tools/demo/params.hpp — the MLP's parameters as shardopt-demo registers them: seeded initial values, the demo's own buffers, f32 <-> 16-bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

// The MLP's sizes: each layer a width x width weight then a bias of width.
struct ModelShape {
  int64_t width = 0;
  int64_t weight_numel = 0;
  int64_t layer_numel = 0;  // weight and bias
  int64_t total_numel = 0;  // all layers
};
ModelShape model_shape(const Options& options);

// "layers.<layer>.<kind>", torch's names for an nn.Sequential of Linear layers.
std::string layer_param_name(int layer, const char* kind);

// bf16/f16 parameters -> the demo's f32 working copy, with the library's own conversions.
void widen(const shardopt::TensorRef& src, float* dst);

// f32 values times `scale` (the loss scale; 1 without scaling) -> bf16/f16, nearest even. A
// power-of-two scale is exact in f32; what does not fit the dtype becomes inf, which the
// optimizer's loss scaling detects.
void narrow(const float* src, int64_t n, float scale, shardopt::DType dtype, uint16_t* dst);

// The one param group (every layer's weight then bias) with its initial values, the same on
// every rank. bucket_view: the values sit in a staging buffer that shardopt copies at
// construction (free_staging() after it). external: these buffers are the parameters and
// gradients and must live as long as the optimizer.
struct ModelParams {
  shardopt::ParamGroupSpec group;
  std::vector<float> staging32;
  std::vector<uint16_t> staging16;
  std::vector<std::vector<float>> own_params32, own_grads32;
  std::vector<std::vector<uint16_t>> own_params16, own_grads16;

  void free_staging();
};

// Not copyable in effect (the group points into the buffers), but a move keeps every vector's
// storage where it is, so returning it by value is safe.
ModelParams make_model_params(const Options& options);

// The optimizer's groups for the model: its one group, or with --optimizer muon each Linear
// weight a Muon group of its own (shape width x width) and each bias an AdamW group of its own,
// in the model's order, so that every parameter keeps the id it has in the one group.
std::vector<shardopt::ParamGroupSpec> optimizer_groups(ModelParams& model, const Options& options);

}  // namespace shardopt_demo
