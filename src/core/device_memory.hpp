// src/core/device_memory.hpp — CUDA allocation, copies, streams and device scoping behind plain C++ (both builds; without CUDA they raise Error(unsupported)).
//
// Streams are `void*` holding a cudaStream_t, as everywhere in shardopt, so that the optimizer
// and its tests can use device memory without including cuda_runtime.h. Every copy and fill
// is enqueued on a stream and returns at once: callers order their work with that stream and
// synchronise it only where the host itself needs the result.
#pragma once

#include <cstddef>
#include <string>

#include "shardopt/types.hpp"

struct cudaPointerAttributes;  // cuda_runtime.h's; declared here so this header needs no CUDA

namespace shardopt {
namespace device {

// Whether this build of libshardopt contains CUDA support.
bool cuda_compiled_in();

// "" when `device` can be used from this process (the CPU always can); otherwise why not,
// in words: "no CUDA driver on this machine (libcuda.so.1: cannot open shared object file...)"
// where the driver is missing, otherwise CUDA's ("no CUDA-capable device is detected", ...).
std::string unusable_reason(Device device);

// `bytes` of memory on CUDA device `device` (cudaMalloc), zero-filled by a cudaMemsetAsync on
// `stream`: work later enqueued on that stream sees zeros without a device-wide sync.
void* cuda_allocate_zeroed(Device device, std::size_t bytes, void* stream);
// Frees what cuda_allocate_zeroed returned. cudaFree waits for the device's pending work, so
// a buffer still used by enqueued kernels or copies is never freed under them.
void cuda_free(Device device, void* p) noexcept;

// Enqueues a copy of `bytes` on `stream`; either side may be device or host memory
// (cudaMemcpyDefault). `device` only names the device in error messages.
void cuda_copy(void* dst, const void* src, std::size_t bytes, void* stream, Device device);
// Enqueues a zero fill of `bytes` device bytes on `stream`.
void cuda_zero(void* dst, std::size_t bytes, void* stream, Device device);
// Blocks until `stream`'s work has finished (this stream only, never the whole device).
void cuda_synchronize(void* stream, Device device, const char* why);

// Events for ordering one stream after another, created once by their owner and re-recorded:
// cudaEventCreateWithFlags(cudaEventDisableTiming), cudaEventDestroy, cudaEventRecord, and
// cudaStreamWaitEvent (work enqueued on `stream` later waits, on the device, for the work
// before the event's last record; the host does not wait).
void* cuda_event_create(Device device);
void cuda_event_destroy(void* event) noexcept;
void cuda_event_record(void* event, void* stream, Device device);
void cuda_stream_wait_event(void* stream, void* event, Device device);

// Error(invalid_argument) naming `what` unless `p` is memory that kernels on `device` can
// use (its device memory, or managed memory): a clear message instead of an illegal-address
// fault inside a kernel later.
void check_cuda_pointer(Device device, const void* p, const std::string& what);

// What cudaPointerGetAttributes says a pointer is, in words for messages: "host memory",
// "pinned host memory", "device memory of cuda:1", "managed memory". Defined in CUDA builds
// only (without CUDA there are no attributes to describe).
std::string memory_kind(const cudaPointerAttributes& attributes);

// A non-blocking CUDA stream created on `device` for shardopt's own use, destroyed with it.
class OwnedStream {
 public:
  OwnedStream() = default;
  explicit OwnedStream(Device device);
  ~OwnedStream();
  OwnedStream(OwnedStream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  void* get() const { return stream_; }

 private:
  void* stream_ = nullptr;
};

// Makes `device` the calling thread's current CUDA device for a scope (allocations and kernel
// launches go to the current device) and restores the previous one after. Nothing for the CPU.
class ScopedDevice {
 public:
  explicit ScopedDevice(Device device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  // The device to restore; -1 when nothing was changed (only CUDA builds change it).
  [[maybe_unused]] int previous_ = -1;
};

}  // namespace device
}  // namespace shardopt
