// kernels/cpu/amx_bf16_gemm.cpp — a bf16 GEMM on AMX tiles for Muon's bf16 Newton-Schulz: operands packed into 16 x 32 bf16 tiles (B in AMX's pair layout), 2 x 2 blocks of 16 x 16 fp32 accumulators.
#include "cpu/amx_bf16_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "kernel_check.hpp"
#include "precision.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHARDOPT_AMX_COMPILED 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define SHARDOPT_AMX_COMPILED 0
#endif

namespace shardopt {
namespace kernels {
namespace {

constexpr int64_t kTileRows = 16;  // rows of every tile
constexpr int64_t kTileK = 32;     // bf16 values along k in one A tile row (64 bytes)
constexpr int64_t kBlock = 32;     // the 2 x 2 tiles of one output block
constexpr int64_t kColumnsPerPass = 256;  // B's columns per pass over A: 512 KiB of bf16 at k 1024

#if SHARDOPT_AMX_COMPILED
int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// The upper 16 bits of a float that holds a bf16 value: exact.
uint16_t bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

bool detect_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool amx_bf16 = (edx & (1u << 22)) != 0;
  const bool amx_tile = (edx & (1u << 24)) != 0;
  const bool osxsave = [] {
    unsigned a, b, c, d;
    __cpuid(1, a, b, c, d);
    return (c & (1u << 27)) != 0;
  }();
  if (!amx_bf16 || !amx_tile || !osxsave) return false;
  unsigned xcr0_low, xcr0_high;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  if ((xcr0_low & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  // The packing and the epilogue run on AVX-512F/BW, which every AMX CPU has; the OS must save
  // the opmask and zmm state as well (XCR0 bits 5-7).
  const bool avx512 = (ebx & (1u << 16)) != 0 && (ebx & (1u << 30)) != 0;
  if (!avx512 || (xcr0_low & 0xe0u) != 0xe0u) return false;
  // Linux hands out the tile data state on request only (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// The tile configuration (palette 1): eight 16-row tiles of 64 bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC 12 warns of the AVX-512 intrinsics' own _mm512_undefined_* placeholders under a target
// attribute: a false alarm.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // a GCC-only warning group: clang (the ThreadSanitizer build) rejects the name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define SHARDOPT_AVX512BW __attribute__((target("avx512f,avx512bw")))

// One block row of `cols` values through the epilogue, round(beta * c + alpha * product), with
// float_to_bf16 itself: vectorised under the target attribute, and never fused
// (-ffp-contract=off), so the bits are the scalar form's.
SHARDOPT_AVX512BW inline void epilogue_row(const float* product, const float* c, float beta, float alpha, float* out,
                                            int64_t cols) {
  if (c == nullptr) {
#pragma omp simd
    for (int64_t q = 0; q < cols; ++q) out[q] = bf16_to_float(float_to_bf16(product[q]));
    return;
  }
#pragma omp simd
  for (int64_t q = 0; q < cols; ++q) out[q] = bf16_to_float(float_to_bf16(beta * c[q] + alpha * product[q]));
}

// 32 floats holding bf16 values to their 32 bf16 bit patterns (the upper halves): one tile row of A.
SHARDOPT_AVX512BW inline void bf16_bits_x32(const float* src, uint16_t* dst) {
  const __m512i upper_halves = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                                27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(_mm512_loadu_si512(src), upper_halves,
                                                     _mm512_loadu_si512(src + 16)));
}

// 16 columns of two rows of B to one tile row of pairs: row kk's bf16 bits in the low halves,
// row kk+1's in the high halves.
SHARDOPT_AVX512BW inline void bf16_pairs_x16(const float* low, const float* high, uint32_t* out) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  _mm512_storeu_si512(out, _mm512_or_si512(_mm512_srli_epi32(_mm512_loadu_si512(low), 16),
                                           _mm512_and_si512(_mm512_loadu_si512(high), high_half)));
}

// dst (16 x 16 words, row stride dst_stride) = src (16 x 16 words, row stride src_stride)
// transposed, in registers.
SHARDOPT_AVX512BW void transpose_16x16(const uint32_t* src, int64_t src_stride, uint32_t* dst, int64_t dst_stride) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_stride);
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of words
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: rows i, i+4, i+8, i+12 hold lane pieces
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * dst_stride, r[i]);
}
#pragma GCC diagnostic pop

// Where a finished 32 x 32 block goes: into `out` (m x n, row-major), the rows and columns past
// m and n (padding) left out, through `epilogue` when there is one.
struct BlockSink {
  float* out = nullptr;
  int64_t m = 0, n = 0;
  const AmxEpilogue* epilogue = nullptr;
};

// The block at (i, j), stored from the tiles into `block` (32 x 32, row-major), written out.
SHARDOPT_AVX512BW void write_block(const float* block, int64_t i, int64_t j, const BlockSink& sink) {
  const int64_t rows = std::min(kBlock, sink.m - i), cols = std::min(kBlock, sink.n - j);
  const AmxEpilogue* e = sink.epilogue;
  for (int64_t r = 0; r < rows; ++r) {
    const float* product = block + r * kBlock;
    float* out = sink.out + (i + r) * sink.n + j;
    if (e == nullptr) {
      std::copy(product, product + cols, out);
      continue;
    }
    epilogue_row(product, e->c == nullptr ? nullptr : e->c + (i + r) * sink.n + j, e->beta, e->alpha, out, cols);
  }
}

// The product of packed A and packed B into `sink`; tiles 0-3 accumulate, 4-5 hold A, 6-7 hold
// B. A: [mp/16][kp/32] tiles of 16 rows x 32 bf16; B: [np/16][kp/32] tiles of 16 k pairs x 16
// columns x 2 (AMX's pair layout). Blocks below the diagonal are skipped when `upper_only`.
__attribute__((target("amx-tile,amx-bf16"))) void tile_products(const uint16_t* a, const uint32_t* b,
                                                                 const BlockSink& sink, int64_t mp, int64_t np,
                                                                 int64_t kp, bool upper_only) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kTileRows;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  const int64_t k_tiles = kp / kTileK;
  const int64_t tile_elements = kTileRows * kTileK;  // 512 bf16 per A tile
  const int64_t tile_words = kTileRows * kTileRows;  // 256 pairs per B tile
  constexpr int64_t kBlockBytes = kBlock * static_cast<int64_t>(sizeof(float));
  alignas(64) float block[kBlock * kBlock];  // one finished block, in L1 until written out
  // B's columns in passes that stay in L2 while every block row of A streams past them (the
  // whole of B, 2 MiB at 1024 x 1024, does not fit beside A's panel). Each accumulator still
  // sums its whole k range in one order from zero: the bits do not depend on the blocking.
  for (int64_t pass = 0; pass < np; pass += kColumnsPerPass) {
    const int64_t pass_end = std::min(np, pass + kColumnsPerPass);
    for (int64_t i = 0; i < mp; i += kBlock) {
      if (upper_only && pass_end <= i) continue;
      const uint16_t* a0 = a + (i / kTileRows) * k_tiles * tile_elements;
      const uint16_t* a1 = a0 + k_tiles * tile_elements;
      for (int64_t j = upper_only ? std::max(i, pass) : pass; j < pass_end; j += kBlock) {
        const uint32_t* b0 = b + (j / kTileRows) * k_tiles * tile_words;
        const uint32_t* b1 = b0 + k_tiles * tile_words;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t t = 0; t < k_tiles; ++t) {
          // Each load just before the first product that reads it: tile registers are not
          // renamed, so a load waits for the products still reading its tile, and this order
          // lets the next loads start while the last products of the step run.
          _tile_loadd(4, a0 + t * tile_elements, 64);
          _tile_loadd(6, b0 + t * tile_words, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_loadd(7, b1 + t * tile_words, 64);
          _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, a1 + t * tile_elements, 64);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, block, kBlockBytes);
        _tile_stored(1, block + kTileRows, kBlockBytes);
        _tile_stored(2, block + kTileRows * kBlock, kBlockBytes);
        _tile_stored(3, block + kTileRows * kBlock + kTileRows, kBlockBytes);
        write_block(block, i, j, sink);
      }
    }
  }
  _tile_release();
}


// Two bf16 values as one 32-bit word of AMX's pair layout: `low` at the lower address.
uint32_t bf16_pair(float low, float high) {
  return static_cast<uint32_t>(bf16_bits(low)) | (static_cast<uint32_t>(bf16_bits(high)) << 16);
}

// A (m x k row-major) into [mp/16][kp/32] tiles of 16 rows x 32 values, zero-padded.
void pack_a(const float* a, int64_t m, int64_t k, int64_t mp, int64_t kp, uint16_t* out) {
  const int64_t k_tiles = kp / kTileK;
  if (m != mp || k != kp) std::fill(out, out + mp * kp, uint16_t{0});
  for (int64_t r = 0; r < m; ++r) {
    const float* row = a + r * k;
    for (int64_t t = 0; t < k_tiles; ++t) {
      uint16_t* dst = out + ((r / kTileRows) * k_tiles + t) * kTileRows * kTileK + (r % kTileRows) * kTileK;
      const int64_t count = std::min(kTileK, k - t * kTileK);
      if (count == kTileK) {
        bf16_bits_x32(row + t * kTileK, dst);
        continue;
      }
      for (int64_t c = 0; c < count; ++c) dst[c] = bf16_bits(row[t * kTileK + c]);
    }
  }
}

// B (k x n) into [np/16][kp/32] tiles of 16 rows x 16 words: word (p, c) of a tile holds the pair
// B[2p][c], B[2p+1][c] of the tile's k range and columns. `b_transposed`: b is B^T, n x k.
void pack_b(const float* b, bool b_transposed, int64_t n, int64_t k, int64_t np, int64_t kp, uint32_t* words) {
  const int64_t k_tiles = kp / kTileK;
  const int64_t tile_words = kTileRows * kTileRows;  // 16 x 16 pairs
  if (n != np || k != kp) std::fill(words, words + np * kp / 2, uint32_t{0});
  const auto read = [&](int64_t kk, int64_t col) {
    if (kk >= k) return 0.f;
    return b_transposed ? b[col * k + kk] : b[kk * n + col];
  };
  if (b_transposed) {  // b is n x k: a column of B is a row of b, read along it
    for (int64_t col = 0; col < n; ++col) {
      uint32_t* column = words + (col / kTileRows) * k_tiles * tile_words + col % kTileRows;
      for (int64_t kk = 0; kk < k; kk += 2) {
        const float high = kk + 1 < k ? b[col * k + kk + 1] : 0.f;
        column[(kk / kTileK) * tile_words + ((kk % kTileK) / 2) * kTileRows] = bf16_pair(b[col * k + kk], high);
      }
    }
  } else {  // b is k x n: two rows of B make one row of pairs
    const int64_t full_columns = n / kTileRows * kTileRows;
    for (int64_t kk = 0; kk < k; kk += 2) {
      uint32_t* pairs = words + (kk / kTileK) * tile_words + ((kk % kTileK) / 2) * kTileRows;
      // 16 columns at a time, one 64-byte tile row each: the bf16 bits of row kk in the low
      // halves, of row kk+1 (zero past k) in the high halves, without a branch per element.
      const float* low_row = b + kk * n;
      const float* high_row = kk + 1 < k ? b + (kk + 1) * n : nullptr;
      for (int64_t col = 0; col < full_columns; col += kTileRows) {
        uint32_t* out = pairs + (col / kTileRows) * k_tiles * tile_words;
        if (high_row != nullptr) {
          bf16_pairs_x16(low_row + col, high_row + col, out);
          continue;
        }
        uint32_t low[kTileRows];
        std::memcpy(low, low_row + col, sizeof low);
        for (int64_t c = 0; c < kTileRows; ++c) out[c] = low[c] >> 16;
      }
      for (int64_t col = full_columns; col < n; ++col) {
        pairs[(col / kTileRows) * k_tiles * tile_words + col % kTileRows] = bf16_pair(read(kk, col), read(kk + 1, col));
      }
    }
  }
}

// For a times a^T, B's tiles are A's transposed as 16 x 16 words (a pair of A's row c at pair
// column p is B's word (p, c)): from the packed A, in cache, instead of from the matrix again.
void pack_b_from_a(const uint16_t* packed_a, int64_t tiles, uint32_t* words) {
  for (int64_t t = 0; t < tiles; ++t) {
    transpose_16x16(reinterpret_cast<const uint32_t*>(packed_a + t * kTileRows * kTileK), kTileRows,
                    words + t * kTileRows * kTileRows, kTileRows);
  }
}

// The symmetric product's blocks below the diagonal were not computed: each of the m x m
// product's rows r gets column r left of the diagonal, 16 x 16 words at a time where whole,
// element by element along the diagonal and the ragged edge.
void mirror_upper(float* product, int64_t m) {
  auto* words = reinterpret_cast<uint32_t*>(product);
  for (int64_t bi = 0; bi < m; bi += kTileRows) {
    int64_t done = 0;  // columns of these rows mirrored so far
    if (bi + kTileRows <= m) {
      for (; done + kTileRows <= bi; done += kTileRows) transpose_16x16(words + done * m + bi, m, words + bi * m + done, m);
    }
    for (int64_t r = bi; r < std::min(m, bi + kTileRows); ++r) {
      for (int64_t u = done; u < r; ++u) product[r * m + u] = product[u * m + r];
    }
  }
}
#endif

}  // namespace

bool amx_bf16_usable() {
#if SHARDOPT_AMX_COMPILED
  static std::once_flag once;
  static bool usable = false;
  std::call_once(once, [] { usable = detect_amx_bf16(); });
  return usable;
#else
  return false;
#endif
}

void amx_bf16_gemm(const float* a, const float* b, bool b_transposed, int64_t m, int64_t n, int64_t k,
                   bool symmetric, float* product, AmxScratch& scratch, const AmxEpilogue* epilogue) {
  SHARDOPT_KERNEL_CHECK(amx_bf16_usable(), unsupported, "amx_bf16_gemm: this CPU or process has no AMX bf16 tiles");
  SHARDOPT_KERNEL_CHECK(!symmetric || (m == n && b == a && b_transposed), invalid_argument,
                        "amx_bf16_gemm: a symmetric product is a times a^T");
#if SHARDOPT_AMX_COMPILED
  const int64_t mp = round_up(m, kBlock), np = round_up(n, kBlock), kp = round_up(k, kTileK);
  scratch.a.resize(static_cast<std::size_t>(mp * kp));
  pack_a(a, m, k, mp, kp, scratch.a.data());
  scratch.b.resize(static_cast<std::size_t>(np * kp / 2));
  if (symmetric) {
    pack_b_from_a(scratch.a.data(), (mp / kTileRows) * (kp / kTileK), scratch.b.data());
  } else {
    pack_b(b, b_transposed, n, k, np, kp, scratch.b.data());
  }
  // Both operands are packed: from here on `product` may be written even where it is a or b.
  tile_products(scratch.a.data(), scratch.b.data(), BlockSink{product, m, n, epilogue}, mp, np, kp, symmetric);
  if (symmetric) mirror_upper(product, m);
#else
  (void)a;
  (void)m;
  (void)n;
  (void)k;
  (void)scratch;
  (void)b;
  (void)b_transposed;
  (void)symmetric;
  (void)product;
  (void)epilogue;
#endif
}

}  // namespace kernels
}  // namespace shardopt
