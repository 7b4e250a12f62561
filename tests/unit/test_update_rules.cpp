// tests/unit/test_update_rules.cpp — the CPU kernels against the per-element rules and hand-computed steps.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "update_rules.hpp"

using namespace shardopt::kernels;

namespace {

std::vector<float> random_values(uint32_t seed, std::size_t n, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct AdamCase {
  const char* name;
  AdamScalars scalars;
};

}  // namespace

TEST_CASE("adam kernel equals the scalar rule bitwise at every size, offset and thread count", "[rules]") {
  const std::vector<AdamCase> cases = {
      {"adam", make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1)},
      {"adam-wd-amsgrad-maximize", make_adam_scalars(1e-2, 0.8, 0.99, 1e-6, 0.1, false, true, true, 3)},
      {"adamw", make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, true, false, false, 7)},
  };
  for (const AdamCase& c : cases) {
    for (std::size_t n : {0u, 1u, 7u, 16u, 33u, 1000u, 70001u}) {
      for (std::size_t offset : {0u, 1u, 3u}) {
        for (int threads : {1, 2}) {
          CAPTURE(c.name, n, offset, threads);
          const auto g = random_values(1, n + offset, -1, 1);
          auto p = random_values(2, n + offset, -1, 1);
          auto m = random_values(3, n + offset, -0.1f, 0.1f);
          auto v = random_values(4, n + offset, 0, 0.01f);
          auto vmax = random_values(5, n + offset, 0, 0.02f);
          auto p_ref = p, m_ref = m, v_ref = v, vmax_ref = vmax;
          const AdamRule rule{c.scalars};
          for (std::size_t i = offset; i < n + offset; ++i) rule(p_ref[i], g[i], m_ref[i], v_ref[i], vmax_ref[i]);
          adam_update_cpu(p.data() + offset, g.data() + offset, m.data() + offset, v.data() + offset,
                          vmax.data() + offset, static_cast<int64_t>(n), c.scalars, threads);
          REQUIRE(same_bits(p, p_ref));
          REQUIRE(same_bits(m, m_ref));
          REQUIRE(same_bits(v, v_ref));
          REQUIRE(same_bits(vmax, vmax_ref));
        }
      }
    }
  }
}

TEST_CASE("sgd kernel equals the scalar rule bitwise for every flag combination", "[rules]") {
  for (int flags = 0; flags < 32; ++flags) {
    const bool momentum = flags & 1, first = flags & 2, nesterov = (flags & 4) && momentum, maximize = flags & 8,
               decay = flags & 16;
    const SgdScalars s = make_sgd_scalars(0.05, momentum ? 0.9 : 0.0, nesterov ? 0.0 : 0.1, decay ? 0.01 : 0.0,
                                          nesterov, maximize, first);
    for (std::size_t n : {0u, 5u, 64u, 70001u}) {
      CAPTURE(flags, n);
      const auto g = random_values(6, n, -1, 1);
      auto p = random_values(7, n, -1, 1);
      auto buf = random_values(8, n, -1, 1);
      auto p_ref = p, buf_ref = buf;
      const SgdRule rule{s};
      for (std::size_t i = 0; i < n; ++i) rule(p_ref[i], g[i], buf_ref[i]);
      sgd_update_cpu(p.data(), g.data(), momentum ? buf.data() : nullptr, static_cast<int64_t>(n), s, 2);
      REQUIRE(same_bits(p, p_ref));
      if (momentum) REQUIRE(same_bits(buf, buf_ref));
    }
  }
}

TEST_CASE("sgd rule, by hand", "[rules]") {
  float p = 1.0f, buf = 0.0f;
  SgdRule{make_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, false, true)}(p, 0.5f, buf);
  REQUIRE(p == 1.0f - 0.1f * 0.5f);
  // First momentum step: torch clones d_p into the buffer (no dampening applied).
  p = 1.0f;
  SgdRule{make_sgd_scalars(0.1, 0.9, 0.5, 0.0, false, false, true)}(p, 0.5f, buf);
  REQUIRE(buf == 0.5f);
  // Second: buf = 0.9*buf + (1-0.5)*g.
  SgdRule{make_sgd_scalars(0.1, 0.9, 0.5, 0.0, false, false, false)}(p, 0.5f, buf);
  REQUIRE(buf == 0.9f * 0.5f + 0.5f * 0.5f);
  // maximize flips the gradient.
  p = 1.0f;
  SgdRule{make_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, true, true)}(p, 0.5f, buf);
  REQUIRE(p == 1.0f + 0.1f * 0.5f);
}

TEST_CASE("adam rule, by hand: the first step moves by lr times the gradient's sign", "[rules]") {
  // After one step m_hat = g and v_hat = g*g, so the update is lr * g / (|g| + eps).
  float p = 0.5f, m = 0.f, v = 0.f, vmax = 0.f;
  AdamRule{make_adam_scalars(0.01, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1)}(p, -2.0f, m, v, vmax);
  REQUIRE(m == Approx(-0.2f).epsilon(1e-7));
  REQUIRE(v == Approx(0.004f).epsilon(1e-6));
  REQUIRE(p == Approx(0.51f).epsilon(1e-6));
  // AdamW decays the parameter first: p*(1 - lr*wd), independent of the gradient's moments.
  float q = 2.0f, m2 = 0.f, v2 = 0.f;
  AdamRule{make_adam_scalars(0.1, 0.9, 0.999, 1e-8, 0.5, true, false, false, 1)}(q, 1.0f, m2, v2, vmax);
  REQUIRE(q == Approx(2.0 * (1 - 0.05) - 0.1).epsilon(1e-6));
  // amsgrad keeps the running maximum of v.
  float r = 0.f, m3 = 0.f, v3 = 1.0f, vmax3 = 5.0f;
  AdamRule{make_adam_scalars(0.1, 0.9, 0.5, 1e-8, 0.0, false, true, false, 2)}(r, 0.f, m3, v3, vmax3);
  REQUIRE(v3 == 0.5f);
  REQUIRE(vmax3 == 5.0f);
}
