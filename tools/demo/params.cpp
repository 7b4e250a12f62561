// tools/demo/params.cpp — building the MLP's param group (seeded values, narrowed to bf16/f16 when asked) and the dtype conversions.
#include "params.hpp"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "data.hpp"
#include "precision.hpp"  // kernels/: bf16/f16 <-> float, the library's own rounding

namespace shardopt_demo {

using shardopt::DType;
using shardopt::TensorRef;

std::string layer_param_name(int layer, const char* kind) {
  return "layers." + std::to_string(layer) + "." + kind;
}

void widen(const TensorRef& src, float* dst) {
  const int64_t n = src.numel;
  if (src.dtype == DType::f32) {
    std::memcpy(dst, src.data, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* h = src.as<const uint16_t>();
  if (src.dtype == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::bf16_to_float(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::f16_to_float(h[i]);
  }
}

void narrow(const float* src, int64_t n, float scale, DType dtype, uint16_t* dst) {
  if (dtype == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::float_to_bf16(src[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::float_to_f16(src[i] * scale);
  }
}

void ModelParams::free_staging() {
  std::vector<float>().swap(staging32);
  std::vector<uint16_t>().swap(staging16);
}

ModelShape model_shape(const Options& options) {
  ModelShape shape;
  shape.width = options.width;
  shape.weight_numel = shape.width * shape.width;
  shape.layer_numel = shape.weight_numel + shape.width;
  shape.total_numel = shape.layer_numel * options.layers;
  return shape;
}

ModelParams make_model_params(const Options& options) {
  const ModelShape shape = model_shape(options);
  const int64_t width = shape.width, weight_numel = shape.weight_numel;
  const int64_t layer_numel = shape.layer_numel, total_numel = shape.total_numel;
  const bool external = options.storage == shardopt::Storage::external;
  const DType dtype = options.dtype;
  const bool half = dtype != DType::f32;

  ModelParams m;
  // 16-bit parameters are drawn in f32 and narrowed, nearest even.
  m.staging32.resize(!external && !half ? static_cast<std::size_t>(total_numel) : 0);
  m.staging16.resize(!external && half ? static_cast<std::size_t>(total_numel) : 0);
  std::vector<float> init_weight(half ? static_cast<std::size_t>(weight_numel) : 0);
  std::vector<float> init_bias(half ? static_cast<std::size_t>(width) : 0);

  shardopt::ParamGroupSpec& group = m.group;
  group.hyper.lr = options.lr;
  // torch.optim.AdamW decays by 0.01 by default (Adam and SGD by 0); without it AdamW would
  // just be Adam again.
  if (options.algorithm == shardopt::Algorithm::adamw) group.hyper.weight_decay = 0.01;
  // bucket_view: `grad` is null (shardopt owns the gradients); external: our gradient buffer.
  const auto spec = [dtype](std::string name, void* param, void* grad, int64_t numel) {
    shardopt::ParamSpec p;
    p.name = std::move(name);
    p.param = TensorRef{param, numel, dtype, shardopt::Device::cpu()};
    p.grad = TensorRef{grad, numel, dtype, shardopt::Device::cpu()};
    return p;
  };
  for (int l = 0; l < options.layers; ++l) {
    void* weight = nullptr;
    void* bias = nullptr;
    void* weight_grad = nullptr;
    void* bias_grad = nullptr;
    if (!half) {
      float* w32 = nullptr;
      float* b32 = nullptr;
      if (external) {
        m.own_params32.emplace_back(static_cast<std::size_t>(weight_numel));
        w32 = m.own_params32.back().data();
        m.own_params32.emplace_back(static_cast<std::size_t>(width));
        b32 = m.own_params32.back().data();
        m.own_grads32.emplace_back(static_cast<std::size_t>(weight_numel));
        weight_grad = m.own_grads32.back().data();
        m.own_grads32.emplace_back(static_cast<std::size_t>(width));
        bias_grad = m.own_grads32.back().data();
      } else {
        w32 = m.staging32.data() + l * layer_numel;
        b32 = w32 + weight_numel;
      }
      init_linear(options.seed, l, options.width, w32, weight_numel, b32, width);
      weight = w32;
      bias = b32;
    } else {
      uint16_t* w16 = nullptr;
      uint16_t* b16 = nullptr;
      if (external) {
        m.own_params16.emplace_back(static_cast<std::size_t>(weight_numel));
        w16 = m.own_params16.back().data();
        m.own_params16.emplace_back(static_cast<std::size_t>(width));
        b16 = m.own_params16.back().data();
        m.own_grads16.emplace_back(static_cast<std::size_t>(weight_numel));
        weight_grad = m.own_grads16.back().data();
        m.own_grads16.emplace_back(static_cast<std::size_t>(width));
        bias_grad = m.own_grads16.back().data();
      } else {
        w16 = m.staging16.data() + l * layer_numel;
        b16 = w16 + weight_numel;
      }
      init_linear(options.seed, l, options.width, init_weight.data(), weight_numel, init_bias.data(), width);
      narrow(init_weight.data(), weight_numel, 1.0f, dtype, w16);
      narrow(init_bias.data(), width, 1.0f, dtype, b16);
      weight = w16;
      bias = b16;
    }
    group.params.push_back(spec(layer_param_name(l, "weight"), weight, weight_grad, weight_numel));
    group.params.push_back(spec(layer_param_name(l, "bias"), bias, bias_grad, width));
  }
  return m;
}

std::vector<shardopt::ParamGroupSpec> optimizer_groups(ModelParams& model, const Options& options) {
  if (options.algorithm != shardopt::Algorithm::muon) return {model.group};
  std::vector<shardopt::ParamGroupSpec> groups;
  for (std::size_t i = 0; i < model.group.params.size(); ++i) {
    const bool weight = i % 2 == 0;  // every layer's weight, then its bias
    shardopt::ParamGroupSpec g;
    g.hyper.lr = model.group.hyper.lr;  // the rest: each algorithm's torch defaults
    g.settings.algorithm = weight ? shardopt::Algorithm::muon : shardopt::Algorithm::adamw;
    g.params.push_back(model.group.params[i]);
    if (weight) g.params.back().shape = {int64_t{options.width}, int64_t{options.width}};
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace shardopt_demo
