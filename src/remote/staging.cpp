// src/remote/staging.cpp — where a caller's buffer lives (cudaPointerGetAttributes) and the copies through the host, or plain host memory in a build without CUDA.
#include "remote/staging.hpp"

#include <cstring>

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/check.hpp"

namespace shardopt {
namespace remote {

#if SHARDOPT_HAVE_CUDA

namespace {
// Asked once: without a driver or a device no pointer is device memory, and every push would
// otherwise pay the runtime's failed initialisation again.
bool cuda_usable() {
  static const bool usable = [] {
    int count = 0;
    const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    cudaGetLastError();
    return ok;
  }();
  return usable;
}
}  // namespace

bool in_device_memory(const void* p) {
  if (p == nullptr || !cuda_usable()) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // no driver or device: then it cannot be device memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice;
}

namespace {
void copy(void* dst, const void* src, std::size_t bytes, const std::string& what) {
  const cudaError_t status = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (status == cudaSuccess) return;
  cudaGetLastError();
  raise(ErrorCode::cuda, "RemoteOptimizer: copying {} ({} bytes of CUDA device memory) through the host failed: {}",
        what, bytes, cudaGetErrorString(status));
}
}  // namespace

HostView::HostView(const void* p, std::size_t bytes, const std::string& what) : p_(p) {
  if (bytes == 0 || !in_device_memory(p)) return;
  copy_.resize(bytes);
  copy(copy_.data(), p, bytes, what);
}

void copy_from_host(void* dst, const void* src, std::size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  if (in_device_memory(dst)) {
    copy(dst, src, bytes, what);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

#else  // !SHARDOPT_HAVE_CUDA

bool in_device_memory(const void*) { return false; }

HostView::HostView(const void* p, std::size_t, const std::string&) : p_(p) {}

void copy_from_host(void* dst, const void* src, std::size_t bytes, const std::string&) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

#endif  // SHARDOPT_HAVE_CUDA

}  // namespace remote
}  // namespace shardopt
