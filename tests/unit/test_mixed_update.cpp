// tests/unit/test_mixed_update.cpp — bf16/f16 updates with fp32 masters, gradient transforms, grad_stats and the dtype conversions of kernels/cpu.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "grad_stats.hpp"
#include "mixed_update.hpp"
#include "precision.hpp"
#include "shardopt/error.hpp"
#include "update_rules.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

std::vector<float> random_floats(uint32_t seed, std::size_t n, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Bitwise equal, except that a NaN only has to meet a NaN: which NaN operand an instruction
// propagates (so the sign and payload of a NaN result) differs between scalar and vector code.
bool same_bits_or_nan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

uint16_t narrow_one(float x, DType dtype) { return dtype == DType::bf16 ? float_to_bf16(x) : float_to_f16(x); }
float widen_one(uint16_t h, DType dtype) { return dtype == DType::bf16 ? bf16_to_float(h) : f16_to_float(h); }

std::vector<uint16_t> narrow_all(const std::vector<float>& x, DType dtype) {
  std::vector<uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = narrow_one(x[i], dtype);
  return out;
}
std::vector<float> widen_all(const std::vector<uint16_t>& x, DType dtype) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = widen_one(x[i], dtype);
  return out;
}

// One optimizer's state for n elements with a 16-bit parameter and its fp32 master.
struct MixedState {
  DType dtype;
  std::vector<uint16_t> param, grad;
  std::vector<float> master, s0, s1, s2;  // sgd: momentum; adam: exp_avg, exp_avg_sq, max_exp_avg_sq

  MixedState(DType d, std::size_t n, uint32_t seed) : dtype(d) {
    master = random_floats(seed, n, -1, 1);
    param = narrow_all(master, d);
    grad = narrow_all(random_floats(seed + 1, n, -2, 2), d);
    s0 = random_floats(seed + 2, n, -0.1f, 0.1f);
    s1 = random_floats(seed + 3, n, 0, 0.01f);
    s2 = random_floats(seed + 4, n, 0, 0.02f);
  }
  UpdateTensors tensors(std::size_t offset = 0) {
    return UpdateTensors{param.data() + offset, grad.data() + offset, master.data() + offset, dtype};
  }
};

struct Rule {
  const char* name;
  bool adam;
  AdamScalars adam_scalars;
  SgdScalars sgd_scalars;
};

std::vector<Rule> rules() {
  return {
      {"adam", true, make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 3), {}},
      {"adamw", true, make_adam_scalars(1e-2, 0.9, 0.99, 1e-6, 0.05, true, false, false, 1), {}},
      {"adam-l2-amsgrad-maximize", true, make_adam_scalars(1e-2, 0.8, 0.99, 1e-6, 0.1, false, true, true, 5), {}},
      {"sgd", false, {}, make_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, false, true)},
      {"sgd-momentum", false, {}, make_sgd_scalars(0.05, 0.9, 0.1, 0.01, false, false, false)},
      {"sgd-nesterov-first", false, {}, make_sgd_scalars(0.05, 0.9, 0.0, 0.0, true, true, true)},
  };
}

// Runs the rule over [begin, end) of the state through the mixed-precision entry point.
void run_mixed(const Rule& rule, MixedState& st, std::size_t begin, std::size_t end,
               const GradTransform& gt, Rounding r, int threads) {
  r.first_index += begin;
  const int64_t n = static_cast<int64_t>(end - begin);
  if (rule.adam) {
    adam_update_cpu(st.tensors(begin), st.s0.data() + begin, st.s1.data() + begin, st.s2.data() + begin, n,
                    rule.adam_scalars, gt, r, threads);
  } else {
    sgd_update_cpu(st.tensors(begin), st.s0.data() + begin, n, rule.sgd_scalars, gt, r, threads);
  }
}

// The float32 rule by hand on widened (and transformed) gradients: the master reference.
void run_reference(const Rule& rule, std::vector<float>& p, const std::vector<float>& g,
                   std::vector<float>& s0, std::vector<float>& s1, std::vector<float>& s2) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (rule.adam) AdamRule{rule.adam_scalars}(p[i], g[i], s0[i], s1[i], s2[i]);
    else SgdRule{rule.sgd_scalars}(p[i], g[i], s0[i]);
  }
}

}  // namespace

TEST_CASE("bf16/f16 updates: the master follows the f32 rule, the parameter is its nearest-even rounding",
          "[mixed]") {
  const std::size_t n = 1037;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Rule& rule : rules()) {
      for (bool transform : {false, true}) {
        CAPTURE(shardopt::dtype_name(dtype), rule.name, transform);
        MixedState st(dtype, n, 100);
        const GradTransform gt = transform ? GradTransform{1.f / 1024, 0.37f} : GradTransform{};
        // Reference: widened gradients, (g * unscale) * clip in float, the plain f32 rule.
        std::vector<float> g = widen_all(st.grad, dtype);
        if (transform) {
          for (float& x : g) x = (x * gt.unscale) * gt.clip;
        }
        std::vector<float> p = st.master, s0 = st.s0, s1 = st.s1, s2 = st.s2;
        run_reference(rule, p, g, s0, s1, s2);
        // Also the library's own f32 path, on the transformed gradients.
        std::vector<float> p32 = st.master, t0 = st.s0, t1 = st.s1, t2 = st.s2;
        if (rule.adam) adam_update_cpu(p32.data(), g.data(), t0.data(), t1.data(), t2.data(), n, rule.adam_scalars, 1);
        else sgd_update_cpu(p32.data(), g.data(), t0.data(), n, rule.sgd_scalars, 1);
        REQUIRE(same_bits(p32, p));

        run_mixed(rule, st, 0, n, gt, Rounding{}, 1);
        REQUIRE(same_bits(st.master, p));
        REQUIRE(same_bits(st.param, narrow_all(p, dtype)));
        REQUIRE(same_bits(st.s0, s0));
        if (rule.adam) {
          REQUIRE(same_bits(st.s1, s1));
          REQUIRE(same_bits(st.s2, s2));
        }
      }
    }
  }
}

TEST_CASE("mixed updates do not depend on splits, thread counts or alignment", "[mixed]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Rule& rule : rules()) {
      for (bool stochastic : {false, true}) {
        for (std::size_t n : {std::size_t{1037}, std::size_t{70001}}) {
          CAPTURE(shardopt::dtype_name(dtype), rule.name, stochastic, n);
          const GradTransform gt{0.5f, 0.8f};
          const Rounding r{stochastic, 1234, 17, 1000};
          MixedState whole(dtype, n, 7);
          MixedState pieces = whole;
          MixedState two = whole;
          run_mixed(rule, whole, 0, n, gt, r, 1);
          // Arbitrary boundaries, odd sizes and offsets (so 16-bit streams start mid-vector).
          const std::size_t cuts[] = {0, 1, 4, 37, 38, n / 3, n / 2 + 5, n - 2, n};
          for (std::size_t k = 0; k + 1 < std::size(cuts); ++k) run_mixed(rule, pieces, cuts[k], cuts[k + 1], gt, r, 1);
          run_mixed(rule, two, 0, n, gt, r, 2);
          for (MixedState* other : {&pieces, &two}) {
            REQUIRE(same_bits(other->master, whole.master));
            REQUIRE(same_bits(other->param, whole.param));
            REQUIRE(same_bits(other->s0, whole.s0));
            REQUIRE(same_bits(other->s1, whole.s1));
            REQUIRE(same_bits(other->s2, whole.s2));
          }
        }
      }
    }
  }
}

TEST_CASE("stochastic rounding of the parameter uses rounding_random(seed, step, first_index + i)", "[mixed][random]") {
  const std::size_t n = 1037;
  for (DType dtype : {DType::bf16, DType::f16}) {
    // Across a 2^32 boundary of the index, where the loops switch block keys.
    for (uint64_t first : {uint64_t{0}, (uint64_t{1} << 32) - 300, (uint64_t{5} << 32) + 11}) {
      CAPTURE(shardopt::dtype_name(dtype), first);
      const Rule rule = rules()[0];
      MixedState st(dtype, n, 21);
      const Rounding r{true, 99, 4, first};
      run_mixed(rule, st, 0, n, GradTransform{}, r, 1);
      std::size_t moved = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const uint32_t random = rounding_random(99, 4, first + i);
        const uint16_t expected = dtype == DType::bf16 ? float_to_bf16_stochastic(st.master[i], random)
                                                       : float_to_f16_stochastic(st.master[i], random);
        REQUIRE(st.param[i] == expected);
        moved += st.param[i] != narrow_one(st.master[i], dtype);
      }
      REQUIRE(moved > n / 10);  // it really is not nearest-even
      // Another seed or step gives other roundings.
      MixedState again(dtype, n, 21);
      run_mixed(rule, again, 0, n, GradTransform{}, Rounding{true, 100, 4, first}, 1);
      REQUIRE(same_bits(again.master, st.master));
      REQUIRE(!same_bits(again.param, st.param));
    }
  }
}

TEST_CASE("f32 through the UpdateTensors form: identity transform is bitwise the plain rule", "[mixed]") {
  const std::size_t n = 5003;
  for (const Rule& rule : rules()) {
    for (bool transform : {false, true}) {
      CAPTURE(rule.name, transform);
      const GradTransform gt = transform ? GradTransform{0.25f, 0.9f} : GradTransform{};
      std::vector<float> p = random_floats(1, n, -1, 1), g = random_floats(2, n, -1, 1);
      std::vector<float> s0 = random_floats(3, n, -0.1f, 0.1f), s1 = random_floats(4, n, 0, 0.01f),
                         s2 = random_floats(5, n, 0, 0.02f);
      // Odd gradients (a signalling NaN, -0, the smallest subnormal) go through the identity
      // transform without any multiply.
      g[3] = std::numeric_limits<float>::signaling_NaN();
      g[4] = -0.f;
      g[5] = std::numeric_limits<float>::denorm_min();
      std::vector<float> rp = p, r0 = s0, r1 = s1, r2 = s2, rg = g;
      if (transform) {
        for (float& x : rg) x = (x * gt.unscale) * gt.clip;
      }
      run_reference(rule, rp, rg, r0, r1, r2);
      const UpdateTensors t{p.data(), g.data(), nullptr, DType::f32};
      const Rounding r{true, 1, 2, 3};  // ignored for f32
      if (rule.adam) adam_update_cpu(t, s0.data(), s1.data(), s2.data(), n, rule.adam_scalars, gt, r, 2);
      else sgd_update_cpu(t, s0.data(), n, rule.sgd_scalars, gt, r, 2);
      REQUIRE(same_bits_or_nan(p, rp));
      REQUIRE(same_bits_or_nan(s0, r0));
      if (rule.adam) {
        REQUIRE(same_bits_or_nan(s1, r1));
        REQUIRE(same_bits_or_nan(s2, r2));
      }
    }
  }
}

// ---- grad_stats_cpu ------------------------------------------------------------------------------

namespace {

template <typename T>
std::vector<T> gradient_values(DType dtype, std::size_t n, uint32_t seed) {
  const std::vector<float> f = random_floats(seed, n, -3, 3);
  if constexpr (std::is_same_v<T, float>) {
    (void)dtype;
    return f;
  } else {
    return narrow_all(f, dtype);
  }
}

float value_of(float x, DType) { return x; }
float value_of(uint16_t x, DType dtype) { return widen_one(x, dtype); }

// The documented order of kernels/grad_stats.hpp, written out element by element.
template <typename T>
double ordered_sum_of_squares(const std::vector<T>& x, DType dtype, float unscale) {
  const int64_t n = static_cast<int64_t>(x.size());
  const StatsShape shape = stats_shape(n);
  double total = 0.0;
  for (int64_t group = 0; group < shape.groups; ++group) {
    double group_sum = 0.0;
    for (int64_t c = group * shape.chunks_per_group; c < std::min(shape.chunks, (group + 1) * shape.chunks_per_group); ++c) {
      double lanes[32] = {};
      for (int64_t i = c * kStatsChunk; i < std::min(n, (c + 1) * kStatsChunk); ++i) {
        const double g = value_of(x[static_cast<std::size_t>(i)], dtype) * unscale;
        lanes[(i - c * kStatsChunk) % 32] += g * g;
      }
      for (int width = 16; width >= 1; width /= 2) {
        for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
      }
      group_sum += lanes[0];
    }
    total += group_sum;
  }
  return total;
}

template <typename T>
void check_stats(DType dtype) {
  // Sizes around chunk and group edges, and one past 1024 chunks (2 chunks per group).
  for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{4096}, std::size_t{4097}, std::size_t{100003},
                        std::size_t{1024 * 4096 + 5000}}) {
    CAPTURE(shardopt::dtype_name(dtype), n);
    const std::vector<T> x = gradient_values<T>(dtype, n, static_cast<uint32_t>(n));
    const float unscale = 0.125f;
    // In long double (64-bit significand on x86), so that the reference's own rounding error
    // is well below the tolerance even for millions of terms.
    long double naive = 0.0L;
    double naive_max = 0.0;
    for (const T& v : x) {
      const double g = static_cast<double>(value_of(v, dtype) * unscale);
      naive += static_cast<long double>(g * g);
      naive_max = std::max(naive_max, std::fabs(g));
    }
    const GradStats one = grad_stats_cpu(x.data(), dtype, static_cast<int64_t>(n), unscale, false, 1);
    REQUIRE_FALSE(one.nonfinite);
    REQUIRE(std::fabs(static_cast<long double>(one.value) - naive) <= 1e-12L * naive);
    REQUIRE(one.value == ordered_sum_of_squares(x, dtype, unscale));  // bitwise
    for (int threads : {2, 4}) {
      const GradStats other = grad_stats_cpu(x.data(), dtype, static_cast<int64_t>(n), unscale, false, threads);
      REQUIRE(std::memcmp(&other.value, &one.value, sizeof(double)) == 0);
    }
    const GradStats inf = grad_stats_cpu(x.data(), dtype, static_cast<int64_t>(n), unscale, true, 2);
    REQUIRE(inf.value == naive_max);
    REQUIRE_FALSE(inf.nonfinite);
  }
}

}  // namespace

TEST_CASE("grad_stats_cpu: sum of squares and max in a thread-independent order", "[stats]") {
  check_stats<float>(DType::f32);
  check_stats<uint16_t>(DType::bf16);
  check_stats<uint16_t>(DType::f16);
}

TEST_CASE("grad_stats_cpu finds inf and NaN anywhere, also from unscaling", "[stats]") {
  const std::size_t n = 9000;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        CAPTURE(shardopt::dtype_name(dtype), bad, at);
        std::vector<float> f = random_floats(3, n, -1, 1);
        f[at] = bad;
        const std::vector<uint16_t> h = dtype == DType::f32 ? std::vector<uint16_t>{} : narrow_all(f, dtype);
        const void* data = dtype == DType::f32 ? static_cast<const void*>(f.data()) : h.data();
        for (int threads : {1, 2}) {
          const GradStats sum = grad_stats_cpu(data, dtype, static_cast<int64_t>(n), 1.f, false, threads);
          REQUIRE(sum.nonfinite);
          REQUIRE(!std::isfinite(sum.value));
          const GradStats max = grad_stats_cpu(data, dtype, static_cast<int64_t>(n), 1.f, true, threads);
          REQUIRE(max.nonfinite);
          if (std::isinf(bad)) {
            REQUIRE(std::isinf(max.value));
          } else {
            REQUIRE(max.value <= 1.0);  // NaN never wins the max
          }
        }
      }
    }
  }
  // Finite gradients that overflow when unscaled are reported too.
  std::vector<float> f(100, 1.f);
  f[42] = 3e38f;
  REQUIRE(grad_stats_cpu(f.data(), DType::f32, 100, 4.f, false, 1).nonfinite);
  REQUIRE_FALSE(grad_stats_cpu(f.data(), DType::f32, 100, 1.f, false, 1).nonfinite);
  const GradStats empty = grad_stats_cpu(nullptr, DType::bf16, 0, 1.f, false, 1);
  REQUIRE(empty.value == 0.0);
  REQUIRE_FALSE(empty.nonfinite);
}

// ---- conversions -----------------------------------------------------------------------------------

TEST_CASE("widen_cpu, narrow_cpu and divide_cpu element by element", "[convert]") {
  const std::size_t n = 70001;  // two threads' worth
  const std::vector<float> f = random_floats(8, n, -100, 100);
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int threads : {1, 2}) {
      CAPTURE(shardopt::dtype_name(dtype), threads);
      std::vector<uint16_t> h(n);
      narrow_cpu(f.data(), h.data(), dtype, static_cast<int64_t>(n), threads);
      REQUIRE(same_bits(h, narrow_all(f, dtype)));
      std::vector<float> w(n);
      widen_cpu(h.data(), dtype, w.data(), static_cast<int64_t>(n), threads);
      REQUIRE(same_bits(w, widen_all(h, dtype)));
      std::vector<uint16_t> d = h;
      divide_cpu(d.data(), dtype, static_cast<int64_t>(n), 3.f, threads);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(d[i] == narrow_one(widen_one(h[i], dtype) / 3.f, dtype));
    }
  }
  std::vector<float> copy(n), divided = f;
  narrow_cpu(f.data(), copy.data(), DType::f32, static_cast<int64_t>(n), 2);
  REQUIRE(same_bits(copy, f));
  widen_cpu(f.data(), DType::f32, copy.data(), static_cast<int64_t>(n), 2);
  REQUIRE(same_bits(copy, f));
  divide_cpu(divided.data(), DType::f32, static_cast<int64_t>(n), 7.f, 2);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(divided[i] == f[i] / 7.f);
}

TEST_CASE("the CPU entry points reject inconsistent tensors", "[mixed][convert]") {
  std::vector<float> f(8, 0.f);
  std::vector<uint16_t> h(8, 0);
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, true, false, 1);
  const SgdScalars momentum = make_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, false, true);
  const auto code_of = [](const auto& call) {
    try {
      call();
    } catch (const shardopt::Error& e) {
      return e.code();
    }
    return shardopt::ErrorCode::internal;  // nothing thrown
  };
  using shardopt::ErrorCode;
  float* p = f.data();
  REQUIRE(code_of([&] { adam_update_cpu(UpdateTensors{p, p, p, DType::f32}, p, p, p, 8, adam, {}, {}, 1); }) ==
          ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { adam_update_cpu(UpdateTensors{h.data(), h.data(), nullptr, DType::bf16}, p, p, p, 8, adam, {}, {}, 1); }) ==
          ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { adam_update_cpu(UpdateTensors{h.data(), h.data(), p, DType::f16}, p, p, nullptr, 8, adam, {}, {}, 1); }) ==
          ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { sgd_update_cpu(UpdateTensors{h.data(), h.data(), p, DType::bf16}, nullptr, 8, momentum, {}, {}, 1); }) ==
          ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { sgd_update_cpu(UpdateTensors{p, p, nullptr, static_cast<DType>(5)}, p, 8, momentum, {}, {}, 1); }) ==
          ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { grad_stats_cpu(nullptr, DType::bf16, 8, 1.f, false, 1); }) == ErrorCode::invalid_argument);
  REQUIRE(code_of([&] { divide_cpu(h.data(), static_cast<DType>(3), 8, 2.f, 1); }) == ErrorCode::invalid_argument);
  // Empty ranges check nothing.
  REQUIRE(code_of([&] { adam_update_cpu(UpdateTensors{}, nullptr, nullptr, nullptr, 0, adam, {}, {}, 1); }) ==
          ErrorCode::internal);
}
