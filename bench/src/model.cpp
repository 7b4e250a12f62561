// bench/src/model.cpp — builds the step benchmark's model and fills parameters and gradients with values every rank can regenerate alone.
#include "model.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include <fmt/format.h>

#include "support.hpp"
#include "precision.hpp"  // kernels/: bf16/f16 <-> float, the library's own rounding

namespace shardopt_bench {

using shardopt::Communicator;
using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::ParamSpec;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

Model make_model(const Options& o) {
  Model m;
  auto add = [&](std::string name, int64_t numel) {
    m.tensors.push_back(Tensor{std::move(name), m.numel, numel});
    m.numel += numel;
  };
  if (o.params > 0) {
    // Equal params, the last one taking the remainder (sizes need not divide anything).
    const int64_t k = std::min<int64_t>(o.tensors, o.params);
    const int64_t base = o.params / k;
    for (int64_t i = 0; i < k; ++i) add(fmt::format("p{}", i), i + 1 < k ? base : o.params - base * (k - 1));
    m.description = fmt::format("tensors={}", k);
  } else {
    const int64_t w = o.width;
    for (int l = 0; l < o.layers; ++l) {
      add(fmt::format("{}.weight", l), w * w);
      add(fmt::format("{}.bias", l), w);
    }
    m.description = fmt::format("layers={} width={}", o.layers, o.width);
  }
  return m;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A value in [-scale, scale) that depends only on (stream, global element index): every rank
// and the reference rebuild the same parameters and gradients without storing or sending them.
float synthetic(uint64_t stream, int64_t index, float scale) {
  const uint64_t h = splitmix64(splitmix64(stream) ^ static_cast<uint64_t>(index));
  return static_cast<float>(static_cast<int32_t>(h >> 32)) * (scale / 2147483648.0f);
}
constexpr uint64_t kParamStream = 1;
constexpr uint64_t kGradStream = 2;
constexpr float kParamScale = 0.05f;
constexpr float kGradScale = 0.01f;

// Rounds to 4 significant bits (towards zero): k x such a value is exact in bf16 (8 bits),
// f16 and f32 for every k <= 16, so sums of up to 16 ranks' copies are exact in any order.
float four_bits(float x) { return shardopt::kernels::bits_float(shardopt::kernels::float_bits(x) & 0xfff00000u); }

// Synthetic values of global elements [first_index, first_index + out.numel) into a buffer of
// out.dtype (bf16/f16: rounded to nearest even from the f32 value).
void fill_synthetic(const TensorRef& out, int64_t first_index, uint64_t stream, float scale, bool coarse,
                    int threads) {
  const int64_t n = out.numel;
  const auto value = [&](int64_t i) {
    const float v = synthetic(stream, first_index + i, scale);
    return coarse ? four_bits(v) : v;
  };
  switch (out.dtype) {
    case DType::f32: {
      float* p = out.as<float>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = value(i);
      break;
    }
    case DType::bf16: {
      uint16_t* p = out.as<uint16_t>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = shardopt::kernels::float_to_bf16(value(i));
      break;
    }
    case DType::f16: {
      uint16_t* p = out.as<uint16_t>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = shardopt::kernels::float_to_f16(value(i));
      break;
    }
    case DType::byte: break;  // the bench never makes byte tensors
  }
}

// Gradients that several ranks sum exactly (see step.hpp), wherever the bench reduces them
// before the steps it checks: stage 2, and every iteration of --mode iteration.
bool coarse_gradients(const Options& o) { return o.stage == 2 || o.mode == BenchMode::iteration; }

}  // namespace

ParamGroupSpec make_group(const Options& o, const std::vector<Tensor>& pieces, shardopt::Device device) {
  ParamGroupSpec group;
  group.hyper.lr = o.lr;
  if (o.algorithm == Algorithm::sgd) group.hyper.momentum = o.momentum;
  for (const Tensor& t : pieces) {
    ParamSpec spec;
    spec.name = t.name;
    spec.param = TensorRef{nullptr, t.numel, o.dtype, device};
    spec.grad = spec.param;
    group.params.push_back(std::move(spec));
  }
  return group;
}

void fill_param_values(const TensorRef& out, int64_t first_index, int threads) {
  fill_synthetic(out, first_index, kParamStream, kParamScale, false, threads);
}

void fill_grad_values(const TensorRef& out, int64_t first_index, const Options& o) {
  fill_synthetic(out, first_index, kGradStream, kGradScale, coarse_gradients(o), o.threads);
}

std::unique_ptr<ZeroOptimizer> build_optimizer(std::shared_ptr<Communicator> comm, const Options& o,
                                               OptimizerConfig config, const std::vector<Tensor>& pieces,
                                               ExternalBuffers& external, InitialValues initial) {
  ParamGroupSpec group = make_group(o, pieces, shardopt::Device::cpu());
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  int64_t total = 0;
  for (const Tensor& t : pieces) total += t.numel;
  if (config.storage == Storage::external) {
    const auto words = static_cast<std::size_t>((total * element_bytes + 3) / 4);
    external.params.assign(words, 0.f);
    external.grads.assign(words, 0.f);
    int64_t at = 0;
    for (ParamSpec& spec : group.params) {
      spec.param.data = reinterpret_cast<char*>(external.params.data()) + at * element_bytes;
      spec.grad.data = reinterpret_cast<char*>(external.grads.data()) + at * element_bytes;
      at += spec.param.numel;
    }
  }
  // through_views: values are written through the views after construction, so that no extra
  // full copy of the initial parameters inflates the peak RSS that the step reports.
  std::vector<float> initial_params;  // at_registration with bucket view: copied in, then freed
  if (initial == InitialValues::at_registration) {
    if (config.storage == Storage::bucket_view) {
      initial_params.assign(static_cast<std::size_t>((total * element_bytes + 3) / 4), 0.f);
      int64_t at = 0;
      for (ParamSpec& spec : group.params) {
        spec.param.data = reinterpret_cast<char*>(initial_params.data()) + at * element_bytes;
        at += spec.param.numel;
      }
    }
    for (std::size_t i = 0; i < pieces.size(); ++i) fill_param_values(group.params[i].param, pieces[i].offset, o.threads);
  }
  auto opt = std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{std::move(group)});
  const bool grad_views = writes_grad_views(*opt, o);
  initial_params = std::vector<float>();
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& t = pieces[i];
    const auto id = static_cast<shardopt::ParamId>(i);
    if (initial == InitialValues::through_views) fill_param_values(opt->param_view(id), t.offset, o.threads);
    if (grad_views) fill_grad_values(opt->grad_view(id), t.offset, o);
  }
  return opt;
}

bool writes_grad_views(const ZeroOptimizer& opt, const Options& o) {
  // The optimizer's own config: the self-check's reference is a stage-1 one under --stage 2.
  if (!(opt.config().stage == 2 && opt.config().storage == Storage::bucket_view)) return true;
  if (!o.stage2_grad_views || opt.num_params() == 0) return false;
  try {
    opt.grad_view(0);
    return true;
  } catch (const shardopt::Error&) {
    return false;  // refused: stage 2 keeps only the shard's gradients here
  }
}

void hand_gradients(ZeroOptimizer& opt, const Options& o, const std::vector<Tensor>& pieces,
                    std::vector<float>& scratch) {
  if (o.storage == Storage::bucket_view && !writes_grad_views(opt, o)) {
    // The gradients are the same every time: generated once, whole, so the hand-over is timed
    // as a user's backward would hand them (a copy out of ready gradients), not their making.
    const auto words_of = [&](int64_t numel) {
      return static_cast<std::size_t>((numel * static_cast<int64_t>(shardopt::dtype_size(o.dtype)) + 3) / 4);
    };
    std::size_t total = 0;
    for (const Tensor& t : pieces) total += words_of(t.numel);
    const bool fill = scratch.size() < total;
    if (fill) scratch.resize(total);
    std::size_t at = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Tensor& t = pieces[i];
      const TensorRef grad{scratch.data() + at, t.numel, o.dtype, shardopt::Device::cpu()};
      if (fill) fill_synthetic(grad, t.offset, kGradStream, kGradScale, true, o.threads);
      opt.reduce_gradient(static_cast<shardopt::ParamId>(i), grad);
      at += words_of(t.numel);
    }
  }
  opt.reduce_gradients();
}

OptimizerConfig make_config(const Options& o) {
  OptimizerConfig config;
  config.algorithm = o.algorithm;
  config.partition = o.partition;
  config.storage = o.storage;
  config.shard_state = o.sharded;
  config.stage = o.stage;
  config.cpu_threads = o.threads;
  config.bucket_bytes = o.bucket_bytes;
  config.pipeline_chunk_bytes = o.pipeline_chunk_bytes;
  config.node_shared_params = o.node_shared_params;
  config.overlap = o.overlap;
  return config;
}

std::vector<Tensor> model_slice(const Model& model, int64_t lo, int64_t hi) {
  std::vector<Tensor> pieces;
  for (const Tensor& t : model.tensors) {
    const int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a < b) pieces.push_back(Tensor{fmt::format("{}[{}:{}]", t.name, a - t.offset, b - t.offset), a, b - a});
  }
  return pieces;
}

}  // namespace shardopt_bench
