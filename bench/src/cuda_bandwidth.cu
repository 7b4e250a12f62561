// bench/src/cuda_bandwidth.cu — device-to-device bandwidths for the --device cuda step's roofline: cudaMemcpy, a copy kernel and a kernel with Adam's streams, each timed with CUDA events.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

#include "cuda_device.hpp"

namespace shardopt_bench {

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// 16-byte loads and stores, grid-stride: what a bandwidth-bound kernel does at its best.
__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

__device__ float4 moment(float4 m, float4 g, float beta) {
  const float keep = 1.f - beta;
  return make_float4(beta * m.x + keep * g.x, beta * m.y + keep * g.y, beta * m.z + keep * g.z, beta * m.w + keep * g.w);
}

// Adam's memory traffic (read p, g, m, v; write p, m, v) with a cheap stand-in for its
// arithmetic: the access pattern, not the rule, is what is being measured.
__global__ void update_kernel(float4* __restrict__ p, const float4* __restrict__ g, float4* __restrict__ m,
                              float4* __restrict__ v, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float4 gi = g[i];
    const float4 mi = moment(m[i], gi, 0.9f);
    const float4 g2 = make_float4(gi.x * gi.x, gi.y * gi.y, gi.z * gi.z, gi.w * gi.w);
    const float4 vi = moment(v[i], g2, 0.999f);
    float4 pi = p[i];
    pi.x -= 1e-3f * mi.x * rsqrtf(vi.x + 1e-8f);
    pi.y -= 1e-3f * mi.y * rsqrtf(vi.y + 1e-8f);
    pi.z -= 1e-3f * mi.z * rsqrtf(vi.z + 1e-8f);
    pi.w -= 1e-3f * mi.w * rsqrtf(vi.w + 1e-8f);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// The best (shortest) of `reps` timed runs of `launch` on `stream`, after one untimed run.
template <typename Launch>
double best_seconds(cudaStream_t stream, int reps, const Launch& launch) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0;
  for (int r = 0; r <= reps; ++r) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    launch();
    check(cudaGetLastError(), "a bandwidth kernel's launch");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    const double s = static_cast<double>(ms) * 1e-3;
    if (r > 0 && (best == 0 || s < best)) best = s;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace

D2DBandwidth measure_d2d_bandwidth(int64_t array_bytes, int reps) {
  D2DBandwidth result;
  // Whole float4s, at least one per array.
  const int64_t n4 = std::max<int64_t>(1, array_bytes / 16);
  result.array_bytes = n4 * 16;
  const auto bytes = static_cast<std::size_t>(result.array_bytes);
  DeviceBuffer p(result.array_bytes), g(result.array_bytes), m(result.array_bytes), v(result.array_bytes);
  for (const DeviceBuffer* b : {&p, &g, &m, &v}) check(cudaMemset(b->data(), 0, bytes), "cudaMemset");

  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  // One full wave of 256-thread blocks (8 per SM keep 2048 threads resident), grid-stride.
  const int threads = 256;
  const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(int64_t{sms} * 8, (n4 + threads - 1) / threads)));

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto gbps = [](double moved_bytes, double s) { return s > 0 ? moved_bytes / s / 1e9 : 0.0; };
  const double array = static_cast<double>(result.array_bytes);
  try {
    result.memcpy_gbps = gbps(2 * array, best_seconds(stream, reps, [&] {
      check(cudaMemcpyAsync(g.data(), p.data(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    }));
    result.copy_gbps = gbps(2 * array, best_seconds(stream, reps, [&] {
      copy_kernel<<<blocks, threads, 0, stream>>>(static_cast<const float4*>(p.data()), static_cast<float4*>(g.data()), n4);
    }));
    result.update_gbps = gbps(7 * array, best_seconds(stream, reps, [&] {
      update_kernel<<<blocks, threads, 0, stream>>>(static_cast<float4*>(p.data()), static_cast<const float4*>(g.data()),
                                                     static_cast<float4*>(m.data()), static_cast<float4*>(v.data()), n4);
    }));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  cudaStreamDestroy(stream);
  return result;
}

}  // namespace shardopt_bench
