// kernels/cuda/muon_kernels.cu — Muon's element-wise CUDA kernels (momentum, copies with bf16 rounding, the norm, the GEMM epilogue, the bf16 operands, the symmetric mirror, the update), each the CPU kernel's arithmetic.
#include <cuda_runtime.h>

#include "cuda/muon_launchers.hpp"
#include "muon_rules.hpp"
#include "precision.hpp"

namespace shardopt {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kSumThreads = 1024;

__device__ __forceinline__ float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

__device__ __forceinline__ float widen(const void* data, DType dtype, int64_t i) {
  if (dtype == DType::bf16) return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  if (dtype == DType::f16) return f16_to_float(static_cast<const uint16_t*>(data)[i]);
  return static_cast<const float*>(data)[i];
}

// A grid-stride loop's grid: enough blocks for n, at most 4096.
unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

__device__ int64_t grid_first() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void momentum_kernel(const void* grad, DType dtype, float* momentum, float* update, int64_t n,
                                GradTransform gt, float weight, float one_minus, bool nesterov) {
  const bool identity = is_identity(gt);
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    float g = widen(grad, dtype, i);
    if (!identity) g = transform_grad(g, gt);
    float buf = momentum[i];
    update[i] = muon_momentum(buf, g, weight, one_minus, nesterov);
    momentum[i] = buf;
  }
}

__global__ void copy_kernel(const float* in, float* out, int64_t rows, int64_t cols, bool transpose, bool round) {
  const int64_t n = rows * cols;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    // i indexes `in`, row-major: (r, c) goes to (c, r) of the cols x rows transpose.
    const int64_t r = i / cols, c = i % cols;
    const float v = round ? round_bf16(in[i]) : in[i];
    out[transpose ? c * rows + r : i] = v;
  }
}

__global__ void sum_squares_kernel(const float* x, int64_t n, double* squares) {
  __shared__ double partial[kSumThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSumThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *squares = partial[0];
}

__global__ void normalize_kernel(float* x, int64_t n, const double* squares, float floor, bool round) {
  float norm = static_cast<float>(sqrt(*squares));
  if (round) norm = round_bf16(norm);
  norm = fmaxf(norm, floor);
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float q = x[i] / norm;
    x[i] = round ? round_bf16(q) : q;
  }
}

__global__ void epilogue_kernel(const float* c, float beta, const float* product, float alpha, int64_t n, float* out,
                                bool round) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float v = c == nullptr ? product[i] : beta * c[i] + alpha * product[i];
    out[i] = round ? round_bf16(v) : v;
  }
}

__global__ void to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_stride()) out[i] = float_to_bf16(in[i]);
}

__global__ void mirror_kernel(float* a, int64_t m) {
  for (int64_t k = grid_first(); k < m * m; k += grid_stride()) {
    const int64_t i = k % m, j = k / m;  // column-major (i, j); the upper triangle holds i <= j
    if (i > j) a[k] = a[j + i * m];
  }
}

__global__ void apply_kernel(void* param, float* master, DType dtype, const float* update, int64_t n, float decay,
                             float neg_lr, bool stochastic, uint32_t step_key, uint64_t first) {
  float* values = dtype == DType::f32 ? static_cast<float*>(param) : master;
  for (int64_t i = grid_first(); i < n; i += grid_stride()) {
    const float decayed = values[i] * decay;  // param.mul_(1 - lr * wd)
    const float v = decayed + neg_lr * update[i];  // param.add_(u, alpha=-lr')
    values[i] = v;
    if (dtype == DType::f32) continue;
    uint16_t* out = static_cast<uint16_t*>(param);
    if (stochastic) {
      const uint32_t random = rounding_random_keyed(step_key, first + static_cast<uint64_t>(i));
      out[i] = dtype == DType::bf16 ? float_to_bf16_stochastic(v, random) : float_to_f16_stochastic(v, random);
    } else {
      out[i] = dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
    }
  }
}

int last_launch() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int launch_muon_momentum(const void* grad, DType dtype, float* momentum, float* update, int64_t n, GradTransform gt,
                         float momentum_weight, float one_minus_momentum, bool nesterov, void* stream) {
  momentum_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      grad, dtype, momentum, update, n, gt, momentum_weight, one_minus_momentum, nesterov);
  return last_launch();
}

int launch_muon_copy(const float* in, float* out, int64_t rows, int64_t cols, bool transpose, bool round_bf16,
                     void* stream) {
  copy_kernel<<<blocks_for(rows * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, rows, cols,
                                                                                          transpose, round_bf16);
  return last_launch();
}

int launch_muon_sum_squares(const float* x, int64_t n, double* squares, void* stream) {
  sum_squares_kernel<<<1, kSumThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, squares);
  return last_launch();
}

int launch_muon_normalize(float* x, int64_t n, const double* squares, float floor, bool round_bf16, void* stream) {
  normalize_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, squares, floor,
                                                                                     round_bf16);
  return last_launch();
}

int launch_muon_epilogue(const float* c, float beta, const float* product, float alpha, int64_t n, float* out,
                         bool round_bf16, void* stream) {
  epilogue_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(c, beta, product, alpha, n, out,
                                                                                    round_bf16);
  return last_launch();
}

int launch_muon_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream) {
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  return last_launch();
}

int launch_muon_mirror(float* a, int64_t m, void* stream) {
  mirror_kernel<<<blocks_for(m * m), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, m);
  return last_launch();
}

int launch_muon_apply(void* param, float* master, DType dtype, const float* update, int64_t n, float decay,
                      float neg_lr, bool stochastic, uint32_t step_key, uint64_t first_index, void* stream) {
  apply_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, master, dtype, update, n, decay, neg_lr, stochastic, step_key, first_index);
  return last_launch();
}

}  // namespace kernels
}  // namespace shardopt
