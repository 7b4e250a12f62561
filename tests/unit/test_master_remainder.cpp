// tests/unit/test_master_remainder.cpp — 16-bit master remainders: exact round trips of every fp32 pattern, and 1,000 steps on every ISA variant with masters bitwise those of an fp32 master.
//
// What holds, precisely: the master rebuilt from (parameter, remainder) is bitwise the fp32
// master at every step; the parameter is the master rounded to nearest with ties away from
// zero, so it equals the fp32 path's nearest-even parameter except where the master's low half
// is exactly 0x8000 under an even high half (one unit of the bf16 pattern larger there).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_isa.hpp"
#include "cpu/kernel_table.hpp"
#include "cpu/update_cpu.hpp"
#include "mixed_update.hpp"
#include "shardopt/error.hpp"
#include "precision.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

// The parameter the remainder path must hold for master m: nearest-even but at exact ties.
uint16_t expected_param(float m) {
  const uint32_t u = float_bits(m);
  const bool tie = (u & 0xffffu) == 0x8000u && ((u >> 16) & 1u) == 0u;
  return tie ? static_cast<uint16_t>((u >> 16) + 1u) : float_to_bf16(m);
}

bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

std::vector<const CpuKernelTable*> runnable_variants() {
  std::vector<const CpuKernelTable*> out;
  const CpuFeatures cpu = detect_cpu_features();
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (cpu_isa_compiled(isa) && cpu_runs_isa(isa, cpu)) out.push_back(&cpu_kernel_table(isa));
  }
  return out;
}

struct Case {
  std::string name;
  bool adam;
  double lr;
  double weight_decay;
  bool decoupled;
  double momentum;
  bool nesterov;
  GradTransform transform;
};

}  // namespace

TEST_CASE("remainder16: every fp32 pattern survives (parameter, remainder) exactly; the parameter rounds ties away "
          "from zero",
          "[remainder]") {
  // Every high half with the low halves around the rounding boundary, then random patterns.
  const uint16_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xc000, 0xfffe, 0xffff};
  std::vector<uint32_t> patterns;
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint16_t low : lows) patterns.push_back((high << 16) | low);
  }
  std::mt19937 gen(5);
  for (int i = 0; i < 1000000; ++i) patterns.push_back(static_cast<uint32_t>(gen()));
  int64_t ties = 0;
  for (uint32_t u : patterns) {
    const float m = bits_float(u);
    const uint16_t p = param_of_master(m);
    const int16_t r = remainder_of_master(m);
    if (float_bits(master_from_remainder(p, r)) != u) FAIL("pattern " << u << " does not round-trip");
    if (is_nan_bits(u)) continue;  // nearest-even quietens NaN; the remainder keeps its bits
    if (p != expected_param(m)) FAIL("pattern " << u << ": parameter " << p << ", expected " << expected_param(m));
    if (p != float_to_bf16(m)) ++ties;
  }
  // The sweep holds 32768 even high halves with a 0x8000 low half, less the NaN ones.
  REQUIRE(ties >= 32768 - 256);
}

TEST_CASE("remainder16: 1,000 steps of sgd/adam/adamw give the fp32 master's bits on every ISA variant", "[remainder]") {
  constexpr int64_t n = 1031;  // odd: vector bodies and scalar tails
  constexpr int kSteps = 1000;
  const std::vector<Case> cases = {
      {"adam", true, 1e-3, 0.0, false, 0.0, false, {}},
      {"adamw-scaled", true, 3e-3, 0.05, true, 0.0, false, GradTransform{1.f / 256.f, 0.75f}},
      {"adam-l2", true, 1e-3, 0.1, false, 0.0, false, {}},
      {"sgd-nesterov", false, 1e-2, 0.01, false, 0.9, true, {}},
      {"sgd-plain", false, 1e-2, 0.0, false, 0.0, false, {}},
  };
  for (const CpuKernelTable* variant : runnable_variants()) {
    for (const Case& c : cases) {
      CAPTURE(cpu_isa_name(variant->isa), c.name);
      std::mt19937 gen(17);
      std::uniform_real_distribution<float> unit(-1.f, 1.f);
      // Masters with arbitrary low halves, an eighth of them exact ties.
      std::vector<float> master(n);
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u = float_bits(unit(gen));
        if (i % 8 == 0) u = (u & 0xfffe0000u) | 0x8000u;
        master[static_cast<std::size_t>(i)] = bits_float(u);
      }
      std::vector<uint16_t> param_fp32(n), param_rem(n);
      std::vector<int16_t> remainder(n);
      for (int64_t i = 0; i < n; ++i) {
        const float m = master[static_cast<std::size_t>(i)];
        param_fp32[static_cast<std::size_t>(i)] = float_to_bf16(m);
        param_rem[static_cast<std::size_t>(i)] = param_of_master(m);
        remainder[static_cast<std::size_t>(i)] = remainder_of_master(m);
      }
      std::vector<float> m1(n, 0.f), v1(n, 0.f), m2(n, 0.f), v2(n, 0.f);
      std::vector<uint16_t> grad(n);
      int64_t ties_seen = 0;
      for (int step = 1; step <= kSteps; ++step) {
        for (uint16_t& g : grad) g = float_to_bf16(unit(gen) * 0.01f);
        const UpdateTensors with_master{param_fp32.data(), grad.data(), master.data(), DType::bf16};
        UpdateTensors with_remainder{param_rem.data(), grad.data(), nullptr, DType::bf16};
        with_remainder.master_remainder = remainder.data();
        if (c.adam) {
          const AdamScalars s = make_adam_scalars(c.lr, 0.9, 0.999, 1e-8, c.weight_decay, c.decoupled, false, false, step);
          variant->adam_update(with_master, m1.data(), v1.data(), nullptr, n, s, c.transform, Rounding{}, 1);
          variant->adam_update(with_remainder, m2.data(), v2.data(), nullptr, n, s, c.transform, Rounding{}, 2);
        } else {
          const SgdScalars s = make_sgd_scalars(c.lr, c.momentum, 0.0, c.weight_decay, c.nesterov, false, step == 1);
          variant->sgd_update(with_master, m1.data(), n, s, c.transform, Rounding{}, 1);
          variant->sgd_update(with_remainder, m2.data(), n, s, c.transform, Rounding{}, 2);
        }
        for (int64_t i = 0; i < n; ++i) {
          const auto k = static_cast<std::size_t>(i);
          const float rebuilt = master_from_remainder(param_rem[k], remainder[k]);
          if (float_bits(rebuilt) != float_bits(master[k])) {
            FAIL("step " << step << " element " << i << ": rebuilt master " << float_bits(rebuilt) << " vs fp32 master "
                         << float_bits(master[k]));
          }
          if (param_rem[k] != expected_param(master[k]) || param_fp32[k] != float_to_bf16(master[k])) {
            FAIL("step " << step << " element " << i << ": parameters " << param_rem[k] << " / " << param_fp32[k]);
          }
          if (param_rem[k] != param_fp32[k]) ++ties_seen;
          if (float_bits(m1[k]) != float_bits(m2[k]) || float_bits(v1[k]) != float_bits(v2[k])) {
            FAIL("step " << step << " element " << i << ": the state differs");
          }
        }
      }
      INFO("parameters one unit apart at exact ties, over all steps: " << ties_seen);
      SUCCEED();
    }
  }
}

TEST_CASE("remainder16: the CPU entry points refuse remainders beside a master, for f32/f16, or with stochastic "
          "rounding",
          "[remainder]") {
  std::vector<uint16_t> h(8, 0);
  std::vector<float> f(8, 0.f);
  std::vector<int16_t> r(8, 0);
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1);
  auto message_of = [](const auto& call) -> std::string {
    try {
      call();
    } catch (const shardopt::Error& e) {
      return e.code() == shardopt::ErrorCode::invalid_argument ? e.what() : "wrong code";
    }
    return "no error";
  };
  UpdateTensors both{h.data(), h.data(), f.data(), DType::bf16};
  both.master_remainder = r.data();
  REQUIRE_THAT(message_of([&] { adam_update_cpu(both, f.data(), f.data(), nullptr, 8, adam, {}, {}, 1); }),
               Catch::Contains("`master_remainder`") && Catch::Contains("`master` is set"));
  UpdateTensors f16{h.data(), h.data(), nullptr, DType::f16};
  f16.master_remainder = r.data();
  REQUIRE_THAT(message_of([&] { adam_update_cpu(f16, f.data(), f.data(), nullptr, 8, adam, {}, {}, 1); }),
               Catch::Contains("the parameter is f16"));
  UpdateTensors bf16{h.data(), h.data(), nullptr, DType::bf16};
  bf16.master_remainder = r.data();
  Rounding stochastic;
  stochastic.stochastic = true;
  REQUIRE_THAT(message_of([&] { adam_update_cpu(bf16, f.data(), f.data(), nullptr, 8, adam, {}, stochastic, 1); }),
               Catch::Contains("stochastic rounding cannot combine with `master_remainder`"));
}
