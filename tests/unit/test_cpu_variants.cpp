// tests/unit/test_cpu_variants.cpp — every CPU kernel ISA variant this machine runs gives the baseline variant's bits, over every kernel, odd lengths and misaligned starts.
//
// What makes checkpoints portable and mixed clusters exact: a run resumed on a machine with
// another ISA continues bitwise. Each case runs the same call through the baseline table and
// through every other variant the CPU runs, on copies of the same buffers, and compares all
// the bytes of every buffer (a write outside the range would show too). The baseline runs on
// one thread and the other variants on two, so thread splits are covered as well.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_isa.hpp"
#include "cpu/kernel_table.hpp"
#include "grad_stats.hpp"
#include "precision.hpp"
#include "shardopt/types.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

// The variants to compare with the baseline: compiled, and runnable on this CPU.
std::vector<const CpuKernelTable*> other_variants() {
  std::vector<const CpuKernelTable*> out;
  const CpuFeatures cpu = detect_cpu_features();
  for (int i = 1; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (cpu_isa_compiled(isa) && cpu_runs_isa(isa, cpu)) out.push_back(&cpu_kernel_table(isa));
  }
  if (out.empty()) WARN("this CPU runs only the baseline CPU kernels: no variant to compare");
  return out;
}

// Lengths around every vector width and unroll (4, 8, 16 lanes), grad_stats' 32 lanes and
// 4096-element chunks, and past the 2^15 elements from which the kernels use a second thread.
const std::vector<int64_t> kLengths = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 127, 129,
                                       1000, 1031, 4095, 4097, 8200, 70001};
// Offsets of the first element from the start of an allocation (16-byte aligned at least).
const std::vector<int64_t> kStarts = {0, 1, 3};
constexpr int64_t kSlack = 8;  // untouched elements after the range

// Random floats of mixed magnitudes (subnormal to large), signs and exact zeros.
std::vector<float> mixed_floats(uint32_t seed, std::size_t n, float scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::uniform_int_distribution<int> kind(0, 63);
  std::vector<float> v(n);
  for (float& x : v) {
    const int k = kind(gen);
    if (k == 0) x = 0.f;
    else if (k == 1) x = -0.f;
    else if (k == 2) x = unit(gen) * 1e-40f;  // float subnormal
    else if (k == 3) x = unit(gen) * 3e-5f;   // f16 subnormal range
    else if (k == 4) x = unit(gen) * 6e4f;    // near the f16 maximum
    else x = unit(gen) * scale;
  }
  return v;
}

// Replaces about one element in 97 by inf, -inf or a NaN with a payload.
void add_nonfinite(std::vector<float>& v, uint32_t seed) {
  std::mt19937 gen(seed);
  for (std::size_t i = gen() % 97; i < v.size(); i += 1 + gen() % 193) {
    const uint32_t pick = gen() % 3;
    uint32_t bits = pick == 0 ? 0x7f800000u : pick == 1 ? 0xff800000u : 0x7fc00000u | (gen() & 0x3fffffu);
    std::memcpy(&v[i], &bits, sizeof bits);
  }
}

std::vector<uint16_t> narrow_all(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = dtype == DType::bf16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
  return out;
}

bool any_nonfinite(const void* x, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (dtype == DType::f32) v = static_cast<const float*>(x)[i];
    else if (dtype == DType::bf16) v = bf16_to_float(static_cast<const uint16_t*>(x)[i]);
    else v = f16_to_float(static_cast<const uint16_t*>(x)[i]);
    if (nonfinite_bit(v) != 0u) return true;
  }
  return false;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Bitwise equal, except that any two NaNs are equal: IEEE 754 leaves the sign and payload of an
// arithmetic NaN result open, and compilers use that freedom (GCC folds p - (-g) * lr into
// p + g * lr, which flips a NaN's sign), so they differ between builds of the same source.
// Every finite and infinite value must match bit for bit.
bool is_nan_bits(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::f32: return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
    case DType::bf16: return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
    default: return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;  // f16
  }
}

bool same_values(const void* a, const void* b, std::size_t count, DType dtype) {
  const std::size_t width = shardopt::dtype_size(dtype);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (std::size_t i = 0; i < count; ++i) {
    uint32_t u = 0, v = 0;
    std::memcpy(&u, x + i * width, width);
    std::memcpy(&v, y + i * width, width);
    if (u != v && !(is_nan_bits(u, dtype) && is_nan_bits(v, dtype))) return false;
  }
  return true;
}

bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_values(a.data(), b.data(), a.size(), DType::f32);
}

// The buffers of one update call: a parameter of dtype (bytes), its gradient, an fp32 master
// for 16-bit parameters, three fp32 state buffers.
struct UpdateBuffers {
  DType dtype;
  std::vector<uint8_t> param, grad;
  std::vector<float> master, s0, s1, s2;

  UpdateBuffers(DType d, std::size_t total, uint32_t seed, bool nonfinite_grads) : dtype(d) {
    const std::vector<float> p = mixed_floats(seed, total, 1.f);
    std::vector<float> g = mixed_floats(seed + 1, total, 2.f);
    if (nonfinite_grads) add_nonfinite(g, seed + 2);
    param = bytes_of(p, d);
    grad = bytes_of(g, d);
    if (d != DType::f32) master = p;
    s0 = mixed_floats(seed + 3, total, 0.1f);
    s1 = mixed_floats(seed + 4, total, 0.01f);
    s2 = mixed_floats(seed + 5, total, 0.02f);
    for (float& x : s1) x = x < 0.f ? -x : x;  // exp_avg_sq and its max are never negative
    for (float& x : s2) x = x < 0.f ? -x : x;
  }

  // The first `total` elements of every buffer of `pool`.
  UpdateBuffers(const UpdateBuffers& pool, std::size_t total)
      : dtype(pool.dtype),
        param(prefix(pool.param, total * shardopt::dtype_size(pool.dtype))),
        grad(prefix(pool.grad, total * shardopt::dtype_size(pool.dtype))),
        master(prefix(pool.master, pool.master.empty() ? 0 : total)),
        s0(prefix(pool.s0, total)),
        s1(prefix(pool.s1, total)),
        s2(prefix(pool.s2, total)) {}
  UpdateBuffers(const UpdateBuffers&) = default;

  template <typename T>
  static std::vector<T> prefix(const std::vector<T>& v, std::size_t count) {
    return std::vector<T>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(count));
  }

  static std::vector<uint8_t> bytes_of(const std::vector<float>& v, DType d) {
    std::vector<uint8_t> out(v.size() * shardopt::dtype_size(d));
    if (d == DType::f32) std::memcpy(out.data(), v.data(), out.size());
    else std::memcpy(out.data(), narrow_all(v, d).data(), out.size());
    return out;
  }

  UpdateTensors tensors(int64_t start) {
    const std::size_t offset = static_cast<std::size_t>(start) * shardopt::dtype_size(dtype);
    return UpdateTensors{param.data() + offset, grad.data() + offset,
                         dtype == DType::f32 ? nullptr : master.data() + start, dtype};
  }

  bool operator==(const UpdateBuffers& o) const {
    const std::size_t width = shardopt::dtype_size(dtype);
    return param.size() == o.param.size() && same_values(param.data(), o.param.data(), param.size() / width, dtype) &&
           same_bytes(grad, o.grad) && same_values(master, o.master) && same_values(s0, o.s0) &&
           same_values(s1, o.s1) && same_values(s2, o.s2);
  }
};

struct Rule {
  std::string name;
  bool adam;
  AdamScalars adam_scalars;
  SgdScalars sgd_scalars;
};

std::vector<Rule> rules() {
  return {
      {"sgd", false, {}, make_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, false, true)},
      {"sgd-decay-maximize", false, {}, make_sgd_scalars(0.1, 0.0, 0.0, 0.01, false, true, false)},
      {"sgd-momentum-first", false, {}, make_sgd_scalars(0.05, 0.9, 0.1, 0.01, false, false, true)},
      {"sgd-momentum", false, {}, make_sgd_scalars(0.05, 0.9, 0.1, 0.01, false, false, false)},
      {"sgd-nesterov-first", false, {}, make_sgd_scalars(0.05, 0.9, 0.0, 0.0, true, false, true)},
      {"sgd-nesterov-maximize", false, {}, make_sgd_scalars(0.05, 0.9, 0.0, 0.001, true, true, false)},
      {"adam", true, make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 3), {}},
      {"adam-l2", true, make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, false, false, false, 1), {}},
      {"adamw", true, make_adam_scalars(1e-2, 0.9, 0.99, 1e-6, 0.05, true, false, false, 7), {}},
      {"adam-amsgrad-maximize", true, make_adam_scalars(1e-2, 0.8, 0.99, 1e-6, 0.1, false, true, true, 5), {}},
      {"adamw-amsgrad", true, make_adam_scalars(3e-3, 0.9, 0.999, 1e-8, 0.01, true, true, false, 100), {}},
  };
}

void run_update(const CpuKernelTable& k, const Rule& rule, UpdateBuffers& b, int64_t start, int64_t n,
                const GradTransform& gt, const Rounding& r, int threads) {
  const UpdateTensors t = b.tensors(start);
  if (rule.adam) {
    k.adam_update(t, b.s0.data() + start, b.s1.data() + start, b.s2.data() + start, n, rule.adam_scalars, gt, r,
                  threads);
  } else {
    k.sgd_update(t, b.s0.data() + start, n, rule.sgd_scalars, gt, r, threads);
  }
}

}  // namespace

TEST_CASE("the process's CPU kernels are the variant cpu_kernel_isa() names", "[cpu-isa]") {
  REQUIRE(active_cpu_kernels().isa == active_cpu_isa());
  REQUIRE(std::string(shardopt::cpu_kernel_isa()) == cpu_isa_name(active_cpu_isa()));
  REQUIRE(std::string(active_cpu_isa_name()) == cpu_isa_name(active_cpu_isa()));
  INFO("CPU kernels: " << active_cpu_isa_name());
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (!cpu_isa_compiled(isa)) continue;
    if (cpu_runs_isa(isa, detect_cpu_features())) REQUIRE(cpu_kernel_table(isa).isa == isa);
  }
}

TEST_CASE("every ISA variant updates with the baseline's bits: sgd, adam, adamw, f32/bf16/f16, rounding modes",
          "[cpu-isa][variants]") {
  const CpuKernelTable& base = cpu_kernel_table(CpuIsa::baseline);
  const auto variants = other_variants();
  // Rounding indices that cross a 2^32 boundary inside the longer ranges.
  const Rounding stochastic{true, 0x1234abcdull, 17, (uint64_t{1} << 32) - 2500};
  const GradTransform scaled{1.f / 1024.f, 0.37f};
  const std::size_t most = static_cast<std::size_t>(kLengths.back() + kStarts.back() + kSlack);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool nonfinite : {false, true}) {
      const UpdateBuffers pool(dtype, most, 11u + static_cast<uint32_t>(dtype) * 10u + (nonfinite ? 5u : 0u),
                               nonfinite);
      for (const CpuKernelTable* variant : variants) {
        for (const Rule& rule : rules()) {
          for (bool round_stochastic : {false, true}) {
            if (dtype == DType::f32 && round_stochastic) continue;
            for (bool transform : {false, true}) {
              for (int64_t n : kLengths) {
                for (int64_t start : kStarts) {
                  CAPTURE(cpu_isa_name(variant->isa), rule.name, shardopt::dtype_name(dtype), round_stochastic,
                          transform, nonfinite, n, start);
                  const std::size_t total = static_cast<std::size_t>(start + n + kSlack);
                  UpdateBuffers expected(pool, total);
                  UpdateBuffers got(pool, total);
                  const GradTransform gt = transform ? scaled : GradTransform{};
                  const Rounding r = round_stochastic ? stochastic : Rounding{};
                  run_update(base, rule, expected, start, n, gt, r, 1);
                  run_update(*variant, rule, got, start, n, gt, r, 2);
                  REQUIRE(got == expected);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("every ISA variant computes grad_stats with the baseline's bits, nonfinite flag included",
          "[cpu-isa][variants]") {
  const CpuKernelTable& base = cpu_kernel_table(CpuIsa::baseline);
  std::vector<int64_t> lengths = kLengths;
  // More than kStatsMaxGroups chunks: groups of several chunks.
  lengths.push_back(kStatsChunk * (kStatsMaxGroups + 3) + 17);
  const std::size_t most = static_cast<std::size_t>(lengths.back() + kStarts.back());
  const auto variants = other_variants();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool nonfinite : {false, true}) {
      std::vector<float> values = mixed_floats(200u + static_cast<uint32_t>(dtype), most, 3.f);
      if (nonfinite) add_nonfinite(values, 300u + static_cast<uint32_t>(dtype));
      const std::vector<uint8_t> grads = UpdateBuffers::bytes_of(values, dtype);
      for (const CpuKernelTable* variant : variants) {
        for (int64_t n : lengths) {
          for (int64_t start : kStarts) {
            const void* grad = grads.data() + static_cast<std::size_t>(start) * shardopt::dtype_size(dtype);
            for (bool inf_norm : {false, true}) {
              for (float unscale : {1.f, 1.f / 3.f}) {
                CAPTURE(cpu_isa_name(variant->isa), shardopt::dtype_name(dtype), nonfinite, n, start, inf_norm,
                        unscale);
                const GradStats expected = base.grad_stats(grad, dtype, n, unscale, inf_norm, 1);
                const GradStats got = variant->grad_stats(grad, dtype, n, unscale, inf_norm, 2);
                REQUIRE(std::memcmp(&got.value, &expected.value, sizeof(double)) == 0);
                REQUIRE(got.nonfinite == expected.nonfinite);
                REQUIRE(got.nonfinite == any_nonfinite(grad, dtype, n));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("every ISA variant widens, narrows and divides with the baseline's bits, NaN payloads included",
          "[cpu-isa][variants]") {
  const CpuKernelTable& base = cpu_kernel_table(CpuIsa::baseline);
  std::mt19937 gen(7);
  for (const CpuKernelTable* variant : other_variants()) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      const std::size_t width = shardopt::dtype_size(dtype);
      for (int64_t n : kLengths) {
        for (int64_t start : kStarts) {
          CAPTURE(cpu_isa_name(variant->isa), shardopt::dtype_name(dtype), n, start);
          const std::size_t total = static_cast<std::size_t>(start + n + kSlack);
          // Random bit patterns: every class of value, NaNs with payloads, ties of both kinds.
          std::vector<uint32_t> float_bits(total);
          for (uint32_t& x : float_bits) x = gen();
          std::vector<float> floats(total);
          std::memcpy(floats.data(), float_bits.data(), total * sizeof(float));
          std::vector<uint8_t> stored(total * width);
          for (uint8_t& x : stored) x = static_cast<uint8_t>(gen());
          const std::size_t at = static_cast<std::size_t>(start);

          std::vector<float> widened_base(total, 0.f), widened(total, 0.f);
          base.widen(stored.data() + at * width, dtype, widened_base.data() + at, n, 1);
          variant->widen(stored.data() + at * width, dtype, widened.data() + at, n, 2);
          REQUIRE(same_bytes(widened, widened_base));

          std::vector<uint8_t> narrowed_base(total * width, 0), narrowed(total * width, 0);
          base.narrow(floats.data() + at, narrowed_base.data() + at * width, dtype, n, 1);
          variant->narrow(floats.data() + at, narrowed.data() + at * width, dtype, n, 2);
          REQUIRE(same_bytes(narrowed, narrowed_base));

          for (float divisor : {3.f, 0.1f, 4.f}) {
            std::vector<uint8_t> divided_base = stored, divided = stored;
            base.divide(divided_base.data() + at * width, dtype, n, divisor, 1);
            variant->divide(divided.data() + at * width, dtype, n, divisor, 2);
            REQUIRE(same_bytes(divided, divided_base));
          }
        }
      }
    }
  }
}

TEST_CASE("every ISA variant runs the bandwidth probes with the baseline's bits", "[cpu-isa][variants]") {
  const CpuKernelTable& base = cpu_kernel_table(CpuIsa::baseline);
  for (const CpuKernelTable* variant : other_variants()) {
    for (int64_t n : kLengths) {
      CAPTURE(cpu_isa_name(variant->isa), n);
      const std::size_t total = static_cast<std::size_t>(n + kSlack);
      const std::vector<float> a = mixed_floats(1, total, 1.f), b = mixed_floats(2, total, 1.f);
      std::vector<float> c_base(total, 0.f), c(total, 0.f);
      base.stream_copy(a.data(), c_base.data(), n, 1);
      variant->stream_copy(a.data(), c.data(), n, 2);
      REQUIRE(same_bytes(c, c_base));

      std::vector<float> t_base(total, 0.f), t(total, 0.f);
      base.stream_triad(t_base.data(), a.data(), b.data(), 0.3f, n, 1);
      variant->stream_triad(t.data(), a.data(), b.data(), 0.3f, n, 2);
      REQUIRE(same_bytes(t, t_base));

      std::vector<float> f_base(total, 0.f), f(total, 0.f);
      std::vector<uint16_t> h_base(total, 0), h(total, 0);
      base.fill_f32(f_base.data(), 0.25f, n, 1);
      variant->fill_f32(f.data(), 0.25f, n, 2);
      base.fill_u16(h_base.data(), 0x3c00, n, 1);
      variant->fill_u16(h.data(), 0x3c00, n, 2);
      REQUIRE(same_bytes(f, f_base));
      REQUIRE(same_bytes(h, h_base));

      for (UpdatePattern pattern : {UpdatePattern::adam, UpdatePattern::sgd_momentum, UpdatePattern::sgd}) {
        std::vector<float> p0 = a, m0 = b, v0 = mixed_floats(3, total, 0.1f);
        std::vector<float> p1 = p0, m1 = m0, v1 = v0;
        base.update_pattern(pattern, p0.data(), a.data(), m0.data(), v0.data(), n, 1);
        variant->update_pattern(pattern, p1.data(), a.data(), m1.data(), v1.data(), n, 2);
        REQUIRE((same_bytes(p0, p1) && same_bytes(m0, m1) && same_bytes(v0, v1)));

        std::vector<float> master0 = b, mm0 = a, vv0 = v0;
        std::vector<float> master1 = master0, mm1 = mm0, vv1 = vv0;
        const std::vector<uint16_t> g16 = narrow_all(a, DType::bf16);
        std::vector<uint16_t> p16_0(total, 0), p16_1(total, 0);
        base.update_pattern_half(pattern, master0.data(), g16.data(), p16_0.data(), mm0.data(), vv0.data(), n, 1);
        variant->update_pattern_half(pattern, master1.data(), g16.data(), p16_1.data(), mm1.data(), vv1.data(), n,
                                     2);
        REQUIRE((same_bytes(master0, master1) && same_bytes(p16_0, p16_1) && same_bytes(mm0, mm1) &&
                 same_bytes(vv0, vv1)));
      }
    }
  }
}
