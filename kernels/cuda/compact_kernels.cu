// kernels/cuda/compact_kernels.cu — Adam/AdamW with 8-bit blockwise moments (one CUDA block per block of 256 moments) and SGD/Adam over bf16 master remainders, bitwise equal to kernels/cpu.
//
// Built with --fmad=false, IEEE division and square root and no flush-to-zero, as
// mixed_kernels.cu: every element takes the CPU loops' operations in the same order. The absmax
// is an exact maximum (order-free, NaN tracked apart), the scale and the nearest-code search are
// q8_state.hpp's (the CPU's bucket lookup finds the same code as this binary search for every
// float), so codes, absmax and parameters match update_q8_cpu.cpp bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "cuda/compact_launchers.hpp"
#include "precision.hpp"
#include "q8_maps.hpp"

namespace shardopt {
namespace kernels {
namespace {

constexpr int kQ8Threads = static_cast<int>(kQ8Block);
constexpr int kWarps = kQ8Threads / 32;
// Grid-stride loops: at most this many blocks per launch.
constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;
constexpr int kRemainderThreads = 256;

// The maps and midpoints in constant memory, copied into shared memory by each block.
struct Q8Tables {
  uint32_t signed_map[256];
  uint32_t unsigned_map[256];
  uint32_t signed_bounds[256];  // 255 midpoints; the last entry is never read
  uint32_t unsigned_bounds[256];
};
constexpr Q8Tables make_q8_tables() {
  Q8Tables t{};
  for (int i = 0; i < 256; ++i) {
    t.signed_map[i] = kQ8SignedMap[i];
    t.unsigned_map[i] = kQ8UnsignedMap[i];
    t.signed_bounds[i] = i < 255 ? kQ8SignedBounds[i] : 0x7f800000u;
    t.unsigned_bounds[i] = i < 255 ? kQ8UnsignedBounds[i] : 0x7f800000u;
  }
  return t;
}
__constant__ Q8Tables kQ8Tables = make_q8_tables();

// The fp32 value the rule updates and its write-back, as update_q8_cpu.cpp's.
template <typename Format>
__device__ __forceinline__ float load_value(const UpdateTensors& t, int64_t i) {
  using Storage = typename Format::Storage;
  const Storage* param = static_cast<const Storage*>(t.param);
  if constexpr (Format::kRemainder) return master_from_remainder(param[i], t.master_remainder[i]);
  else if constexpr (Format::kHasMaster) return t.master[i];
  else return param[i];
}

template <typename Format, bool kStochastic>
__device__ __forceinline__ void store_value(const CompactCommon& c, int64_t i, float p) {
  using Storage = typename Format::Storage;
  Storage* param = static_cast<Storage*>(c.t.param);
  if constexpr (Format::kRemainder) {
    param[i] = param_of_master(p);
    c.t.master_remainder[i] = remainder_of_master(p);
  } else if constexpr (Format::kHasMaster) {
    c.t.master[i] = p;
    const uint32_t random = kStochastic ? rounding_random_keyed(c.step_key, c.first_index + static_cast<uint64_t>(i)) : 0u;
    param[i] = narrow_param<Format, kStochastic>(p, random);
  } else {
    param[i] = p;
  }
}

template <typename Format>
__device__ __forceinline__ float gradient(const CompactCommon& c, int64_t i) {
  const float g = Format::widen(static_cast<const typename Format::Storage*>(c.t.grad)[i]);
  return c.transform ? transform_grad(g, c.gt) : g;
}

// max |x| over the block's active threads (NaN never wins a comparison) and whether any is NaN;
// every thread gets both.
__device__ __forceinline__ float block_absmax(float x, bool active, bool& nan, float* warp_max) {
  const float a = active ? fabsf(x) : 0.f;
  const bool is_nan = a != a;
  float largest = is_nan ? 0.f : a;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, largest, offset);
    largest = other > largest ? other : largest;
  }
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = largest;
  nan = __syncthreads_or(is_nan) != 0;  // also orders the warp maxima before they are read
  float result = 0.f;
  for (int w = 0; w < kWarps; ++w) result = warp_max[w] > result ? warp_max[w] : result;
  return result;
}

// One moment's new absmax and code (update_q8_cpu.cpp's quantise_block, one element a thread).
__device__ __forceinline__ uint8_t quantise(float x, bool active, int64_t len, const uint32_t* bounds, float* warp_max,
                                            float* absmax_out) {
  bool nan = false;
  const float largest = block_absmax(x, active, nan, warp_max);
  const float raw = nan ? __int_as_float(0x7fc00000) : largest;
  const float clamped = q8_clamp_below(raw, bits_float(kQ8AbsmaxFloorBits));
  float scaled;
  if (len == kQ8Block) {
    const float inverse = 1.f / clamped;
    scaled = x * inverse;
    if (threadIdx.x == 0) *absmax_out = raw;
  } else {
    scaled = x / clamped;
    if (threadIdx.x == 0) *absmax_out = clamped;
  }
  return static_cast<uint8_t>(q8_nearest_code(bounds, q8_clamp_unit(scaled)));
}

template <typename Format, bool kStochastic>
__global__ void __launch_bounds__(kQ8Threads) adam_q8_kernel(CompactCommon c, Q8Moments q, AdamScalars s) {
  __shared__ uint32_t signed_map[256], unsigned_map[256], signed_bounds[256], unsigned_bounds[256];
  __shared__ float warp_max[2][kWarps];
  const int tid = static_cast<int>(threadIdx.x);
  signed_map[tid] = kQ8Tables.signed_map[tid];
  unsigned_map[tid] = kQ8Tables.unsigned_map[tid];
  signed_bounds[tid] = kQ8Tables.signed_bounds[tid];
  unsigned_bounds[tid] = kQ8Tables.unsigned_bounds[tid];
  __syncthreads();
  const AdamRule rule{s};
  const int64_t blocks = q8_blocks(c.n);
  for (int64_t block = blockIdx.x; block < blocks; block += gridDim.x) {
    const int64_t lo = block * kQ8Block;
    const int64_t len = c.n - lo < kQ8Block ? c.n - lo : kQ8Block;
    const int64_t i = lo + tid;
    const bool active = tid < len;
    float m = 0.f, v = 0.f;
    if (active) {
      m = bits_float(signed_map[q.exp_avg[i]]) * q.exp_avg_absmax[block];
      v = bits_float(unsigned_map[q.exp_avg_sq[i]]) * q.exp_avg_sq_absmax[block];
      float p = load_value<Format>(c.t, i);
      float unused = 0.f;
      rule(p, gradient<Format>(c, i), m, v, unused);
      store_value<Format, kStochastic>(c, i, p);
    }
    // Every thread has read its block's absmax before thread 0 overwrites it.
    const uint8_t code1 = quantise(m, active, len, signed_bounds, warp_max[0], q.exp_avg_absmax + block);
    const uint8_t code2 = quantise(v, active, len, unsigned_bounds, warp_max[1], q.exp_avg_sq_absmax + block);
    if (active) {
      q.exp_avg[i] = code1;
      q.exp_avg_sq[i] = code2;
    }
    __syncthreads();  // warp_max is reused by the next block
  }
}

__global__ void __launch_bounds__(kRemainderThreads) adam_remainder_kernel(CompactCommon c, float* m, float* v,
                                                                        float* vmax, AdamScalars s) {
  const AdamRule rule{s};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < c.n; i += stride) {
    float p = load_value<Bf16RemainderFormat>(c.t, i);
    float unused = 0.f;
    rule(p, gradient<Bf16RemainderFormat>(c, i), m[i], v[i], s.amsgrad ? vmax[i] : unused);
    store_value<Bf16RemainderFormat, false>(c, i, p);
  }
}

__global__ void __launch_bounds__(kRemainderThreads) sgd_remainder_kernel(CompactCommon c, float* buf, SgdScalars s) {
  const SgdRule rule{s};
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < c.n; i += stride) {
    float p = load_value<Bf16RemainderFormat>(c.t, i);
    float unused = 0.f;
    rule(p, gradient<Bf16RemainderFormat>(c, i), s.use_momentum ? buf[i] : unused);
    store_value<Bf16RemainderFormat, false>(c, i, p);
  }
}

unsigned int grid_of(int64_t units) {
  return static_cast<unsigned int>(units < kMaxGridBlocks ? units : kMaxGridBlocks);
}

template <typename F>
int with_q8_format(const CompactCommon& c, const F& f) {
  switch (c.t.dtype) {
    case DType::f32: return f(F32Format{}, std::false_type{});
    case DType::bf16:
      if (c.t.master_remainder != nullptr) return f(Bf16RemainderFormat{}, std::false_type{});
      return c.stochastic ? f(Bf16Format{}, std::true_type{}) : f(Bf16Format{}, std::false_type{});
    case DType::f16: return c.stochastic ? f(F16Format{}, std::true_type{}) : f(F16Format{}, std::false_type{});
    case DType::byte: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int launch_adam_q8(const CompactCommon& c, const Q8Moments& q, const AdamScalars& s, void* stream) {
  if (c.n == 0) return cudaSuccess;
  return with_q8_format(c, [&](auto format, auto stochastic) {
    adam_q8_kernel<decltype(format), decltype(stochastic)::value>
        <<<grid_of(q8_blocks(c.n)), kQ8Threads, 0, static_cast<cudaStream_t>(stream)>>>(c, q, s);
    return static_cast<int>(cudaGetLastError());
  });
}

int launch_adam_remainder(const CompactCommon& c, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                          const AdamScalars& s, void* stream) {
  if (c.n == 0) return cudaSuccess;
  adam_remainder_kernel<<<grid_of((c.n + kRemainderThreads - 1) / kRemainderThreads), kRemainderThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(c, exp_avg, exp_avg_sq, max_exp_avg_sq, s);
  return static_cast<int>(cudaGetLastError());
}

int launch_sgd_remainder(const CompactCommon& c, float* momentum_buf, const SgdScalars& s, void* stream) {
  if (c.n == 0) return cudaSuccess;
  sgd_remainder_kernel<<<grid_of((c.n + kRemainderThreads - 1) / kRemainderThreads), kRemainderThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(c, momentum_buf, s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kernels
}  // namespace shardopt
