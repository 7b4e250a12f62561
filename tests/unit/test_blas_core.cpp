// tests/unit/test_blas_core.cpp — OpenBLAS's core for Muon's products: the core a CPU should run, the switch out of a fallback core, and a user's OPENBLAS_CORETYPE kept.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cblas.h>

#include "cpu/blas_core.hpp"
#include "cpu/muon_cpu.hpp"

using namespace shardopt::kernels;

namespace {

CpuFeatures avx2_features() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}

CpuFeatures avx512_features() {
  CpuFeatures f = avx2_features();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}

// A deterministic matrix with entries in [-1, 1).
std::vector<float> sample_matrix(int64_t count, uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.f;
  }
  return v;
}

}  // namespace

TEST_CASE("blas core: the core a CPU should run and which cores already do", "[blas-core]") {
  CHECK(blas_core_for(CpuFeatures{}).empty());
  CHECK(blas_core_for(avx2_features()) == "Haswell");
  CHECK(blas_core_for(avx512_features()) == "SkylakeX");
  CpuFeatures avx512_without_bw = avx512_features();
  avx512_without_bw.avx512bw = false;  // Knights Landing-like: no SkylakeX kernels
  CHECK(blas_core_for(avx512_without_bw) == "Haswell");

  CHECK_FALSE(blas_core_at_least("Prescott", "SkylakeX"));
  CHECK_FALSE(blas_core_at_least("Haswell", "SkylakeX"));
  CHECK_FALSE(blas_core_at_least("Sandybridge", "Haswell"));
  CHECK(blas_core_at_least("SkylakeX", "SkylakeX"));
  CHECK(blas_core_at_least("COOPERLAKE", "SkylakeX"));
  CHECK(blas_core_at_least("SapphireRapids", "Haswell"));
  CHECK(blas_core_at_least("Zen", "Haswell"));
  CHECK(blas_core_at_least("Prescott", ""));
}

TEST_CASE("blas core: out of a fallback core before Muon's first product, and the products still right",
          "[blas-core]") {
  const char* user_choice = std::getenv("OPENBLAS_CORETYPE");
  if (user_choice != nullptr && *user_choice != '\0') {
    WARN("OPENBLAS_CORETYPE is set: kept by design (the [.blas-core-env] case checks that)");
    return;
  }
  const std::string wanted = blas_core_for(detect_cpu_features());
  const BlasCore& core = ensure_blas_core();
  CAPTURE(core.picked_at_load, core.in_use, core.why, wanted);
  // What OpenBLAS runs now is the core the CPU runs (or better), whatever it picked at load.
  CHECK(blas_core_at_least(core.in_use, wanted));
  CHECK(core.in_use == openblas_get_corename());
  CHECK(core.switched == (core.in_use != core.picked_at_load));
  CHECK(core.why.find(core.switched ? "switched to" : "OpenBLAS's own choice") != std::string::npos);
  CHECK(&ensure_blas_core() == &core);  // once per process

  // The switched core computes: sgemm and ssyrk against a double reference.
  const int m = 37, n = 53, k = 41;
  const std::vector<float> a = sample_matrix(int64_t{m} * k, 1), b = sample_matrix(int64_t{k} * n, 2);
  std::vector<float> c(static_cast<std::size_t>(m) * n), s(static_cast<std::size_t>(m) * m, 0.f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c.data(), n);
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, m, k, 1.f, a.data(), k, 0.f, s.data(), m);
  double worst = 0.0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double want = 0.0;
      for (int l = 0; l < k; ++l) want += double(a[std::size_t(i) * k + l]) * double(b[std::size_t(l) * n + j]);
      worst = std::max(worst, std::fabs(want - c[std::size_t(i) * n + j]));
    }
    for (int j = i; j < m; ++j) {
      double want = 0.0;
      for (int l = 0; l < k; ++l) want += double(a[std::size_t(i) * k + l]) * double(a[std::size_t(j) * k + l]);
      worst = std::max(worst, std::fabs(want - s[std::size_t(i) * m + j]));
    }
  }
  CHECK(worst < 1e-4);  // 41 products of entries below 1 in fp32
}

// Run by ctest with OPENBLAS_CORETYPE=Prescott: a user's choice is never overridden.
TEST_CASE("blas core: a user's OPENBLAS_CORETYPE is kept", "[.blas-core-env]") {
  const char* user_choice = std::getenv("OPENBLAS_CORETYPE");
  REQUIRE(user_choice != nullptr);
  const BlasCore& core = ensure_blas_core();
  CAPTURE(core.picked_at_load, core.in_use, core.why);
  CHECK_FALSE(core.switched);
  CHECK(core.in_use == core.picked_at_load);
  CHECK(core.in_use == openblas_get_corename());
  CHECK(core.why == std::string("OPENBLAS_CORETYPE=") + user_choice + " set by the user: kept");
}

// Not run by ctest: prints a hash of one f32 Newton-Schulz, to compare the bits of a switched
// core with OPENBLAS_CORETYPE naming the same core (two processes).
TEST_CASE("blas core: the bits of one Newton-Schulz", "[.blas-core-bits]") {
  const int64_t rows = 96, cols = 160;
  const std::vector<float> g = sample_matrix(rows * cols, 3);
  std::vector<float> out(g.size());
  MuonScalars s;
  MuonWorkspace ws;
  newton_schulz_cpu(g.data(), out.data(), rows, cols, s, MuonPrecision::f32, 1, ws);
  uint64_t hash = 1469598103934665603ull;
  for (float x : out) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  std::printf("core=%s newton_schulz_bits=%016llx\n", openblas_get_corename(), static_cast<unsigned long long>(hash));
}
