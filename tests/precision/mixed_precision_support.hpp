// tests/precision/mixed_precision_support.hpp — 16-bit encodings, grid gradients and one training trial over a communicator, shared by the mixed-precision tests.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "shardopt/checkpoint.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_mixed_precision_test {

using namespace shardopt;
using shardopt_test::busy_hyperparams;
using shardopt_test::error_of;
using shardopt_test::world;

inline std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

// Sizes with odd lengths, one larger than a bucket, and one tiny param: spread over ranks, they
// straddle shard and bucket boundaries.
const std::vector<int64_t> kSizes = {1, 37, 1000, 4099, 16, 3};

inline uint16_t narrow(float x, DType dtype) {
  return dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x);
}
inline float widen(uint16_t h, DType dtype) {
  return dtype == DType::bf16 ? kernels::bf16_to_float(h) : kernels::f16_to_float(h);
}

// A parameter's values as raw 16- or 32-bit words, so one container serves every dtype.
using Words = std::vector<uint32_t>;

inline Words encode(const std::vector<float>& values, DType dtype) {
  Words out;
  out.reserve(values.size());
  for (float v : values) {
    uint32_t word = 0;
    if (dtype == DType::f32) std::memcpy(&word, &v, 4);
    else word = narrow(v, dtype);
    out.push_back(word);
  }
  return out;
}

// Copies words into a buffer of `dtype` elements and back.
inline void store(const Words& words, void* data, DType dtype) {
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (dtype == DType::f32) {
      std::memcpy(static_cast<char*>(data) + 4 * i, &words[i], 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(words[i]);
      std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2);
    }
  }
}
inline Words load(const TensorRef& view) {
  Words out(static_cast<std::size_t>(view.numel));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (view.dtype == DType::f32) {
      std::memcpy(&out[i], static_cast<char*>(view.data) + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, static_cast<char*>(view.data) + 2 * i, 2);
      out[i] = h;
    }
  }
  return out;
}

// Gradients on a coarse grid (k / 128, |k| <= 16): sums over up to 4 ranks and squares are
// exact in bf16/f16/f32 and double, so averaging and norms are exact whatever the order — and
// N ranks can be compared with one rank bitwise even through reduce_gradients and clipping.
inline std::vector<float> grid_grads(uint32_t seed, int64_t n) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> k(-16, 16);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& v : g) v = static_cast<float>(k(gen)) / 128.f;
  return g;
}

struct Trial {
  DType dtype = DType::bf16;
  Algorithm algorithm = Algorithm::adamw;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  int stage = 1;
  bool stochastic = false;
  bool reduce = true;      // go through reduce_gradients (identical grads on every rank)
  double clip = 0.0;       // > 0: clip_grad_norm(clip) before each step
  int64_t pipeline = 0;    // OptimizerConfig::pipeline_chunk_bytes
  int steps = 4;
};

// Trains the kSizes model for trial.steps steps over `comm`; returns every param's words.
inline std::vector<Words> train(const std::shared_ptr<Communicator>& comm, const Trial& t) {
  OptimizerConfig config;
  config.algorithm = t.algorithm;
  config.partition = t.partition;
  config.storage = t.storage;
  config.stage = t.stage;
  config.stochastic_rounding = t.stochastic;
  config.rounding_seed = 7;
  config.bucket_bytes = 512;  // several buckets, and params cut across them
  config.pipeline_chunk_bytes = t.pipeline;
  const std::size_t width = dtype_size(t.dtype);
  std::vector<std::vector<char>> params(kSizes.size()), grads(kSizes.size());
  std::vector<ParamGroupSpec> groups(2);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    params[i].resize(static_cast<std::size_t>(kSizes[i]) * width);
    grads[i].resize(static_cast<std::size_t>(kSizes[i]) * width);
    store(encode(shardopt_test::seeded_values(static_cast<uint32_t>(100 + i), kSizes[i]), t.dtype), params[i].data(), t.dtype);
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{params[i].data(), kSizes[i], t.dtype, Device::cpu()};
    if (t.storage == Storage::external) p.grad = TensorRef{grads[i].data(), kSizes[i], t.dtype, Device::cpu()};
    groups[i % 2].params.push_back(p);
  }
  groups[0].hyper = busy_hyperparams(t.algorithm);
  groups[1].hyper = busy_hyperparams(t.algorithm);
  groups[1].hyper.lr = *groups[1].hyper.lr * 0.5;
  ZeroOptimizer opt(comm, config, groups);

  for (int step = 0; step < t.steps; ++step) {
    opt.zero_grad();
    // Backward order: last registered first, as a trainer's hooks would hand them.
    for (std::size_t j = kSizes.size(); j-- > 0;) {
      const ParamId id = opt.find_param("p" + std::to_string(j));
      const Words g = encode(grid_grads(static_cast<uint32_t>(1000 * step + j), kSizes[j]), t.dtype);
      if (t.stage == 2 && t.storage == Storage::bucket_view) {
        std::vector<char> local(static_cast<std::size_t>(kSizes[j]) * width);
        store(g, local.data(), t.dtype);
        opt.reduce_gradient(id, TensorRef{local.data(), kSizes[j], t.dtype, Device::cpu()});
      } else {
        store(g, opt.grad_view(id).data, t.dtype);
      }
    }
    if (t.reduce || t.stage == 2) opt.reduce_gradients();
    if (t.clip > 0) opt.clip_grad_norm(t.clip);
    opt.step();
  }
  std::vector<Words> out;
  for (std::size_t i = 0; i < kSizes.size(); ++i) out.push_back(load(opt.param_view(opt.find_param("p" + std::to_string(i)))));
  return out;
}

inline std::string trial_name(const Trial& t) {
  return fmt::format("{} {} {} {} stage {}{}{}", dtype_name(t.dtype), algorithm_name(t.algorithm),
                     partition_name(t.partition), t.storage == Storage::external ? "external" : "bucket_view",
                     t.stage, t.stochastic ? " stochastic" : "", t.clip > 0 ? " clipped" : "");
}

}  // namespace shardopt_mixed_precision_test
