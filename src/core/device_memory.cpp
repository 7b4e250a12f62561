// src/core/device_memory.cpp — the CUDA runtime calls behind device_memory.hpp, or Error(unsupported) in a build without CUDA.
#include "core/device_memory.hpp"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#endif

#include "core/check.hpp"

namespace shardopt {
namespace device {

#if SHARDOPT_HAVE_CUDA

namespace {

void check(cudaError_t status, const char* what, Device device) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that the caller's next call does not see it
  raise(ErrorCode::cuda, "{} on {} failed: {} ({})", what, device_name(device),
        cudaGetErrorString(status), cudaGetErrorName(status));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The CUDA runtime is linked statically and loads the driver itself; without one it reports
// cudaErrorInsufficientDriver ("CUDA driver version is insufficient..."), which reads as if an
// old driver were installed. "" when the driver loads; otherwise what is missing, in words.
std::string missing_driver() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
    return "";
  }
  const char* why = dlerror();
  return fmt::format("no CUDA driver on this machine ({}); install the NVIDIA driver, or use the "
                     "CPU", why != nullptr ? why : "libcuda.so.1 cannot be loaded");
}

}  // namespace

std::string memory_kind(const cudaPointerAttributes& attributes) {
  switch (attributes.type) {
    case cudaMemoryTypeUnregistered: return "host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return fmt::format("device memory of cuda:{}", attributes.device);
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown kind";
}

bool cuda_compiled_in() { return true; }

std::string unusable_reason(Device device) {
  if (!device.is_cuda()) return "";
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice) {
      std::string no_driver = missing_driver();
      if (!no_driver.empty()) return no_driver;
    }
    return fmt::format("no CUDA device is usable: {} ({})", cudaGetErrorString(status),
                       cudaGetErrorName(status));
  }
  if (device.index < 0 || device.index >= count) {
    return fmt::format("{} does not exist: this process sees {} CUDA device(s)",
                       device_name(device), count);
  }
  return "";
}

void* cuda_allocate_zeroed(Device device, std::size_t bytes, void* stream) {
  const ScopedDevice scope(device);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    // Out of device memory is the caller's to handle (a smaller model, more ranks), not a fault.
    raise(status == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::cuda,
          "cudaMalloc of {} bytes on {} failed: {} ({})", bytes,
          device_name(device), cudaGetErrorString(status), cudaGetErrorName(status));
  }
  const cudaError_t zeroed = cudaMemsetAsync(p, 0, bytes, as_stream(stream));
  if (zeroed != cudaSuccess) {
    cudaFree(p);
    check(zeroed, "cudaMemsetAsync (zero-filling a new buffer)", device);
  }
  return p;
}

void cuda_free(Device device, void* p) noexcept {
  if (p == nullptr) return;
  // Not ScopedDevice: a destructor path must not throw, whatever state the device is in.
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device.index &&
                        cudaSetDevice(device.index) == cudaSuccess;
  cudaFree(p);
  if (switched) cudaSetDevice(previous);
  cudaGetLastError();
}

void cuda_copy(void* dst, const void* src, std::size_t bytes, void* stream, Device device) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "cudaMemcpyAsync",
        device);
}

void cuda_zero(void* dst, std::size_t bytes, void* stream, Device device) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), "cudaMemsetAsync", device);
}

void cuda_synchronize(void* stream, Device device, const char* why) {
  const cudaError_t status = cudaStreamSynchronize(as_stream(stream));
  if (status != cudaSuccess) {
    cudaGetLastError();
    raise(ErrorCode::cuda, "cudaStreamSynchronize on {} ({}) failed: {} ({})", device_name(device),
          why, cudaGetErrorString(status), cudaGetErrorName(status));
  }
}

void* cuda_event_create(Device device) {
  const ScopedDevice scope(device);
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", device);
  return event;
}

void cuda_event_destroy(void* event) noexcept {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void cuda_event_record(void* event, void* stream, Device device) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), as_stream(stream)), "cudaEventRecord", device);
}

void cuda_stream_wait_event(void* stream, void* event, Device device) {
  check(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent",
        device);
}

void check_cuda_pointer(Device device, const void* p, const std::string& what) {
  SHARDOPT_CHECK(p != nullptr, invalid_argument, "{} is null", what);
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (status != cudaSuccess) {
    cudaGetLastError();  // says nothing about the device's health
    raise(ErrorCode::invalid_argument, "{}: cannot tell where it lives: {}", what,
          cudaGetErrorString(status));
  }
  const bool usable = attributes.type == cudaMemoryTypeManaged ||
                      (attributes.type == cudaMemoryTypeDevice && attributes.device == device.index);
  SHARDOPT_CHECK(usable, invalid_argument, "{} is {}, but it is declared on {}", what,
                 memory_kind(attributes), device_name(device));
}

OwnedStream::OwnedStream(Device device) {
  const ScopedDevice scope(device);
  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream, which other libraries may use, never stalls ours.
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", device);
  stream_ = stream;
}

OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) cudaStreamDestroy(as_stream(stream_));
}

OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(as_stream(stream_));
    stream_ = other.stream_;
    other.stream_ = nullptr;
  }
  return *this;
}

ScopedDevice::ScopedDevice(Device device) {
  if (!device.is_cuda()) return;
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice", device);
  if (current == device.index) return;
  check(cudaSetDevice(device.index), "cudaSetDevice", device);
  previous_ = current;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

#else  // !SHARDOPT_HAVE_CUDA

namespace {

[[noreturn]] void no_cuda(const char* what) {
  raise(ErrorCode::unsupported, "{}: this build has no CUDA support (configure with "
        "SHARDOPT_WITH_CUDA=ON where the CUDA toolkit is installed)", what);
}

}  // namespace

bool cuda_compiled_in() { return false; }

std::string unusable_reason(Device device) {
  return device.is_cuda() ? "this build has no CUDA support" : "";
}

void* cuda_allocate_zeroed(Device, std::size_t, void*) { no_cuda("cuda_allocate_zeroed"); }
void cuda_free(Device, void*) noexcept {}
void cuda_copy(void*, const void*, std::size_t, void*, Device) { no_cuda("cuda_copy"); }
void cuda_zero(void*, std::size_t, void*, Device) { no_cuda("cuda_zero"); }
void cuda_synchronize(void*, Device, const char*) { no_cuda("cuda_synchronize"); }
void check_cuda_pointer(Device, const void*, const std::string&) { no_cuda("check_cuda_pointer"); }
void* cuda_event_create(Device) { no_cuda("cuda_event_create"); }
void cuda_event_destroy(void*) noexcept {}
void cuda_event_record(void*, void*, Device) { no_cuda("cuda_event_record"); }
void cuda_stream_wait_event(void*, void*, Device) { no_cuda("cuda_stream_wait_event"); }

OwnedStream::OwnedStream(Device) { no_cuda("OwnedStream"); }
OwnedStream::~OwnedStream() = default;
OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  stream_ = other.stream_;
  other.stream_ = nullptr;
  return *this;
}

ScopedDevice::ScopedDevice(Device device) {
  if (device.is_cuda()) no_cuda("ScopedDevice");
}
ScopedDevice::~ScopedDevice() = default;

#endif  // SHARDOPT_HAVE_CUDA

}  // namespace device
}  // namespace shardopt
