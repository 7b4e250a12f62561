// tests/capi/capi_training_support.hpp — 16-bit float conversions, raw-registered models and optimizer readers shared by the C ABI training tests.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_capi_training_test {

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- 16-bit floats ------------------------------------------------------------------------------

inline uint32_t bits_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of_bits(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even (finite values).
inline uint16_t bf16_of(float f) {
  const uint32_t u = bits_of(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float float_of_bf16(uint16_t h) { return float_of_bits(static_cast<uint32_t>(h) << 16); }

constexpr uint16_t kF16Inf = 0x7c00;

// Values exactly representable as normal f16 numbers (or zero) only: the tests choose them so.
inline uint16_t f16_of(float f) {
  if (f == 0.0f) return 0;
  const uint32_t u = bits_of(f);
  const int exponent = static_cast<int>((u >> 23) & 0xffu) - 127 + 15;
  REQUIRE((u & 0x1fffu) == 0);  // no more than f16's 10 mantissa bits
  REQUIRE(exponent > 0);
  REQUIRE(exponent < 31);
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | (static_cast<uint32_t>(exponent) << 10) |
                               ((u & 0x7fffffu) >> 13));
}

inline float float_of_f16(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0 && mantissa == 0) return float_of_bits(sign);
  if (exponent == 31) return float_of_bits(sign | 0x7f800000u | (mantissa << 13));
  REQUIRE(exponent != 0);  // no subnormals in these tests
  return float_of_bits(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// ---- models -------------------------------------------------------------------------------------

inline shardopt_tensor cpu_tensor(void* data, int64_t numel, shardopt_dtype dtype) {
  shardopt_tensor t;
  t.data = data;
  t.numel = numel;
  t.dtype = dtype;
  t.device_kind = SHARDOPT_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

// Params "p0".."pN" of `dtype` (16-bit values kept as raw bits) registered raw: bucket view
// (initial values) or external (the caller's parameter and gradient buffers).
struct Model16 {
  std::vector<std::string> names;
  std::vector<std::vector<uint16_t>> values;
  std::vector<std::vector<uint16_t>> grads;
  std::vector<shardopt_param_desc> descs;

  Model16(const std::vector<int64_t>& sizes, shardopt_dtype dtype, bool external,
          const std::vector<std::vector<uint16_t>>& initial) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(initial[i]);
      grads.emplace_back(static_cast<std::size_t>(sizes[i]), uint16_t{0});
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param = cpu_tensor(values[i].data(), sizes[i], dtype);
      if (external) d.grad = cpu_tensor(grads[i].data(), sizes[i], dtype);
      descs.push_back(d);
    }
  }

  shardopt_param_group_desc group(const shardopt_hyperparams* hyper) const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs.data();
    g.num_params = descs.size();
    g.hyperparams = hyper;
    return g;
  }
};

// f32 params "p0".."pN" with rank-independent initial values, bucket view.
struct Model32 {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<shardopt_param_desc> descs;

  explicit Model32(const std::vector<int64_t>& sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(shardopt_test::seeded_values(31u + static_cast<uint32_t>(i), sizes[i]));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param = cpu_tensor(values[i].data(), sizes[i], SHARDOPT_DTYPE_F32);
      descs.push_back(d);
    }
  }

  shardopt_param_group_desc group(const shardopt_hyperparams* hyper = nullptr) const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs.data();
    g.num_params = descs.size();
    g.hyperparams = hyper;
    return g;
  }
};

// Creates an optimizer, failing the test (with the message) if it cannot.
inline shardopt_optimizer_t create(const CommHandle& comm, const shardopt_optimizer_config& config,
                            const shardopt_param_group_desc& group) {
  shardopt_optimizer_t opt = nullptr;
  const shardopt_status status = shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  return opt;
}

template <typename T>
inline std::vector<T> param_values(shardopt_optimizer_t opt, int32_t id) {
  shardopt_tensor v{};
  REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
  const T* data = static_cast<const T*>(v.data);
  return std::vector<T>(data, data + v.numel);
}

inline shardopt_step_report last_step(shardopt_optimizer_t opt) {
  shardopt_step_report report;
  shardopt_step_report_init(&report);
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  return report;
}

inline double loss_scale(shardopt_optimizer_t opt) {
  double scale = -1.0;
  REQUIRE(shardopt_optimizer_loss_scale(opt, &scale) == SHARDOPT_OK);
  return scale;
}

// A gradient whose sum over any number of ranks is exact in f32 (multiples of 1/8, small), so
// that every reduction order and collective gives the same bits.
inline float exact_grad(int32_t id, int step, int64_t i, int rank) {
  return 0.125f * static_cast<float>((i * 3 + id + step) % 9 - 4) * static_cast<float>(rank + 1);
}

}  // namespace shardopt_capi_training_test
