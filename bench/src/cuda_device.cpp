// bench/src/cuda_device.cpp — cuda_device.hpp over the CUDA runtime: device choice and facts, device memory, blocking copies, synchronisation and event timers (the bandwidth kernels are in cuda_bandwidth.cu).
#include "cuda_device.hpp"

#include <stdexcept>

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace shardopt_bench {

namespace {

// A failed CUDA call is a failed run: it becomes an exception that main reports with the rank.
void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the message is about this call only
  throw std::runtime_error(fmt::format("{} failed: {}", what, cudaGetErrorString(status)));
}

}  // namespace

bool cuda_compiled_in() { return true; }

std::string cuda_unusable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device: {}", cudaGetErrorString(status));
  }
  if (count == 0) return "no usable CUDA device: cudaGetDeviceCount reported 0 devices";
  return "";
}

int use_local_device(int local_rank) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  const int index = local_rank % count;
  check(cudaSetDevice(index), "cudaSetDevice");
  return index;
}

DeviceInfo current_device_info() {
  DeviceInfo info;
  check(cudaGetDevice(&info.index), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, info.index), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  return info;
}

DeviceBuffer::DeviceBuffer(int64_t bytes) : bytes_(bytes) {
  // One byte at least, so that an empty buffer still has a distinct device address.
  check(cudaMalloc(&data_, static_cast<std::size_t>(bytes > 0 ? bytes : 1)), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

void copy_to_device(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return;
  // After all queued work: a view shardopt just zero-filled on a non-blocking stream of its own
  // is not ordered against cudaMemcpy's stream otherwise.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaMemcpy(device_dst, host_src, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  // From pageable memory cudaMemcpy may return before the device has the bytes.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void copy_to_host(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes <= 0) return;
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaMemcpy(host_dst, device_src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}

void synchronize_device() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void synchronize_stream(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

StreamTimer::StreamTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  const cudaError_t second = cudaEventCreate(&b);
  if (second != cudaSuccess) cudaEventDestroy(a);
  check(second, "cudaEventCreate");
  start_ = a;
  stop_ = b;
}

StreamTimer::~StreamTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void StreamTimer::start(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(start_), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}

void StreamTimer::stop(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
}

double StreamTimer::seconds() {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace shardopt_bench
