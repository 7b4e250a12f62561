// tests/unit/test_amx_bf16_gemm.cpp — the AMX bf16 GEMM of Muon's bf16 Newton-Schulz against a double reference of the same bf16 operands, padded and unpadded shapes, symmetric products exactly symmetric.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/amx_bf16_gemm.hpp"
#include "cpu/muon_cpu.hpp"
#include "precision.hpp"

using namespace shardopt::kernels;

namespace {

// Deterministic bf16 values (the low 16 bits cleared) in [-1, 1).
std::vector<float> bf16_matrix(int64_t count, uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    float f = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.f;
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits &= 0xffff0000u;
    std::memcpy(&x, &bits, sizeof x);
  }
  return v;
}

// The largest |got - a B| over the m x n product, B k x n (or its transpose, n x k).
double worst_error(const std::vector<float>& a, const std::vector<float>& b, bool b_transposed, int64_t m,
                   int64_t n, int64_t k, const std::vector<float>& got) {
  double worst = 0.0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double want = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const float bv = b_transposed ? b[static_cast<std::size_t>(c * k + l)] : b[static_cast<std::size_t>(l * n + c)];
        want += double(a[static_cast<std::size_t>(r * k + l)]) * double(bv);
      }
      worst = std::max(worst, std::fabs(want - got[static_cast<std::size_t>(r * n + c)]));
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("AMX bf16 GEMM: products of bf16 values in fp32, any shape", "[amx]") {
  if (!amx_bf16_usable()) {
    WARN("no AMX bf16 tiles in this process: the bf16 products run on OpenBLAS's sgemm");
    CHECK_FALSE(bf16_products_on_amx());
    return;
  }
  AmxScratch scratch;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 3, 5}, Shape{37, 53, 41}, Shape{32, 64, 96}, Shape{48, 16, 33}}) {
    CAPTURE(s.m, s.n, s.k);
    const std::vector<float> a = bf16_matrix(s.m * s.k, 11), b = bf16_matrix(s.k * s.n, 12);
    std::vector<float> got(static_cast<std::size_t>(s.m * s.n), -7.f);
    amx_bf16_gemm(a.data(), b.data(), false, s.m, s.n, s.k, false, got.data(), scratch);
    // k products of entries below 1, each exact in fp32, summed in fp32.
    CHECK(worst_error(a, b, false, s.m, s.n, s.k, got) < 1e-5 * static_cast<double>(s.k));
    const std::vector<float> bt = bf16_matrix(s.n * s.k, 13);
    amx_bf16_gemm(a.data(), bt.data(), true, s.m, s.n, s.k, false, got.data(), scratch);
    CHECK(worst_error(a, bt, true, s.m, s.n, s.k, got) < 1e-5 * static_cast<double>(s.k));
  }
  // a a^T: the upper blocks computed, the lower mirrored: exactly symmetric, equal to the full product's upper half.
  for (int64_t m : {5, 40, 70}) {
    const int64_t k = 45;
    const std::vector<float> a = bf16_matrix(m * k, 17);
    std::vector<float> sym(static_cast<std::size_t>(m * m)), full(static_cast<std::size_t>(m * m));
    amx_bf16_gemm(a.data(), a.data(), true, m, m, k, true, sym.data(), scratch);
    amx_bf16_gemm(a.data(), a.data(), true, m, m, k, false, full.data(), scratch);
    CHECK(worst_error(a, a, true, m, m, k, sym) < 1e-5 * static_cast<double>(k));
    int asymmetric = 0, upper_differs = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < m; ++c) {
        asymmetric += sym[static_cast<std::size_t>(r * m + c)] != sym[static_cast<std::size_t>(c * m + r)];
        if (c >= r) upper_differs += sym[static_cast<std::size_t>(r * m + c)] != full[static_cast<std::size_t>(r * m + c)];
      }
    }
    CHECK(asymmetric == 0);
    CHECK(upper_differs == 0);
  }
}

TEST_CASE("AMX bf16 GEMM epilogue: bit for bit round_to_bf16(beta c + alpha product), in place, on ragged edges", "[amx]") {
  if (!amx_bf16_usable()) {
    WARN("no AMX bf16 tiles in this process");
    return;
  }
  AmxScratch scratch;
  // Column counts that leave 1, 15, 16 and 17 of a block's 32 columns, and whole blocks.
  for (int64_t n : {33, 47, 48, 49, 64}) {
    const int64_t m = 37, k = 41;
    CAPTURE(n);
    const std::vector<float> a = bf16_matrix(m * k, 31), b = bf16_matrix(k * n, 32);
    std::vector<float> product(static_cast<std::size_t>(m * n));
    amx_bf16_gemm(a.data(), b.data(), false, m, n, k, false, product.data(), scratch);
    // c with ties to even both ways, a value that rounds up into the next binade, inf and NaN:
    // the vector rounding must meet every case the scalar one does.
    std::vector<float> c(product.size());
    const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f800000u, 0x7fc0ffffu, 0x7f7fffffu, 0xffffffffu};
    for (std::size_t i = 0; i < c.size(); ++i) {
      uint32_t bits = 0x3e000000u + static_cast<uint32_t>(i * 2654435761u % 0x01000000u);
      if (i % 7 == 3) bits = specials[(i / 7) % 7];
      std::memcpy(&c[i], &bits, sizeof bits);
    }
    const float beta = 2.0315f, alpha = -4.775f;
    std::vector<float> want(product.size()), round_only(product.size());
    for (std::size_t i = 0; i < product.size(); ++i) {
      volatile float scaled_c = beta * c[i], scaled_p = alpha * product[i];  // never fused
      want[i] = bf16_to_float(float_to_bf16(scaled_c + scaled_p));
      round_only[i] = bf16_to_float(float_to_bf16(product[i]));
    }
    // In place, as Newton-Schulz runs it (c is the output).
    std::vector<float> got = c;
    const AmxEpilogue polynomial{got.data(), beta, alpha};
    amx_bf16_gemm(a.data(), b.data(), false, m, n, k, false, got.data(), scratch, &polynomial);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    // beta 1, alpha 0: c itself rounded, so its ties reach the rounding unchanged.
    std::vector<float> tied = c;
    const AmxEpilogue copy_c{tied.data(), 1.f, 0.f};
    amx_bf16_gemm(a.data(), b.data(), false, m, n, k, false, tied.data(), scratch, &copy_c);
    int tie_mismatches = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      volatile float zero_p = 0.f * product[i];
      const float w = bf16_to_float(float_to_bf16(c[i] + zero_p));
      tie_mismatches += std::memcmp(&w, &tied[i], sizeof w) != 0;
    }
    CHECK(tie_mismatches == 0);
    const AmxEpilogue rounding{};
    std::vector<float> rounded(product.size(), -3.f);
    amx_bf16_gemm(a.data(), b.data(), false, m, n, k, false, rounded.data(), scratch, &rounding);
    CHECK(std::memcmp(rounded.data(), round_only.data(), rounded.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("Muon's bf16 Newton-Schulz on AMX stays within a few bf16 steps of the fp32 one", "[amx]") {
  // Run without SHARDOPT_CPU_ISA (the [cpu-isa-env] runs force a variant, which keeps sgemm).
  if (!bf16_products_on_amx()) {
    WARN("bf16 products on OpenBLAS's sgemm here (no AMX, or SHARDOPT_CPU_ISA set)");
    return;
  }
  // The orthogonalised matrix has singular values near 1 whichever path summed: its entries
  // agree within a few bf16 steps of the largest (the paths round differently at each step).
  const int64_t rows = 96, cols = 160;
  const std::vector<float> g = bf16_matrix(rows * cols, 21);
  MuonScalars s;
  MuonWorkspace ws;
  std::vector<float> out(g.size()), f32(g.size());
  newton_schulz_cpu(g.data(), out.data(), rows, cols, s, MuonPrecision::bf16, 1, ws);
  newton_schulz_cpu(g.data(), f32.data(), rows, cols, s, MuonPrecision::f32, 1, ws);
  double worst = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, std::fabs(double(out[i]) - double(f32[i])));
    largest = std::max(largest, std::fabs(double(f32[i])));
  }
  CAPTURE(worst, largest);
  CHECK(worst < 0.05 * largest);  // bf16 arithmetic against fp32: a few bf16 steps
  CHECK(worst > 0.0);             // and it did run in bf16
}

TEST_CASE("AMX scratch: packed operands start on 64-byte boundaries (one cache line per tile row)", "[amx]") {
  // Sizes of every kind of block glibc hands out (small bins and mmap'd chunks, which start 16
  // bytes past a line), resized as the products grow.
  shardopt::kernels::AmxScratch scratch;
  for (std::size_t count : {std::size_t{16}, std::size_t{1000}, std::size_t{40000}, std::size_t{1} << 20}) {
    scratch.a.resize(count);
    scratch.b.resize(count / 2 + 1);
    CHECK(reinterpret_cast<std::uintptr_t>(scratch.a.data()) % 64 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(scratch.b.data()) % 64 == 0);
  }
}
