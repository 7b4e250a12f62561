// kernels/cpu/amx_bf16_gemm.hpp — Muon's bf16 products on the CPU's AMX tiles (bf16 operands, fp32 accumulation), where the CPU and OS have them.
//
// torch's bf16 matmul runs on AMX through oneDNN; OpenBLAS's fp32 sgemm of bf16 values (the
// emulation) is 3-4x slower per product, and Debian's OpenBLAS has no bf16 GEMM (sbgemm). The
// result is what the emulation computes up to the summation order: each product of two bf16
// values is exact in fp32 and summed in fp32 (TDPBF16PS: pairs of products, fixed order per
// element, denormals treated as zero). One thread, one order: the bits do not depend on the
// thread count, only on the machine having AMX.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/cache_line_allocator.hpp"

namespace shardopt {
namespace kernels {

// Packed operands, kept between calls (grow to the largest matrix), on cache lines: each
// 64-byte tile row is then one line.
struct AmxScratch {
  std::vector<uint16_t, CacheLineAllocator<uint16_t>> a;  // A's tiles: 16 rows x 32 bf16
  std::vector<uint32_t, CacheLineAllocator<uint32_t>> b;  // B's tiles: 16 rows x 16 pairs of bf16
};

// Whether this process runs AMX bf16 tiles: the CPU has AMX-TILE and AMX-BF16, the OS saves
// their state, and the kernel granted this process the tile data permission (asked once).
// False off x86-64 or without compiler support. Cached after the first call (thread-safe).
bool amx_bf16_usable();

// Applied to each element of the product as its block leaves the tiles, while the block is in
// L1: out = round_to_bf16(beta * c + alpha * product), in fp32 without fused multiply-add
// (Newton-Schulz's epilogues, muon_cpu.cpp), or out = round_to_bf16(product) without `c`. `c`
// is m x n row-major and may be the output itself (each element is read before it is written).
struct AmxEpilogue {
  const float* c = nullptr;
  float beta = 0.f;
  float alpha = 1.f;
};

// product (m x n, fp32, row-major) = a (m x k) times B, where B is k x n given either as
// `b` row-major (b_transposed false) or as its transpose, n x k row-major (b_transposed true).
// a and b hold bf16 values in fp32 (exactly representable: the bf16 emulation's operands).
// symmetric (a times a^T: b == a, transposed): only the upper blocks are computed, then
// mirrored, so the product is exactly symmetric. With `epilogue`, `product` receives the
// epilogue's result instead (a and b may then alias `product`: they are packed before any
// block is written). Requires amx_bf16_usable().
void amx_bf16_gemm(const float* a, const float* b, bool b_transposed, int64_t m, int64_t n, int64_t k,
                   bool symmetric, float* product, AmxScratch& scratch, const AmxEpilogue* epilogue = nullptr);

}  // namespace kernels
}  // namespace shardopt
