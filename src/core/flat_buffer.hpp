// src/core/flat_buffer.hpp — a 64-byte-aligned, zero-filled buffer of f32/bf16/f16 elements in host memory or on a CUDA device, owned or over a shared mapping.
//
// The memory is held by a shared_ptr: keeper() hands out shared ownership, so a view given to
// a user (a Python array, a DLPack export) keeps the memory it points into alive after the
// buffer itself is resized, replaced or destroyed by a layout change. The buffer is move-only:
// two buffers never alias one allocation by accident.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "core/abandoned_memory.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace core {

// Frees with the allocator that matches the memory's device, or later: while a collective
// that was abandoned (it timed out; MPI cannot cancel it) may still read or write the memory,
// the free waits for it (core/abandoned_memory.hpp). (A namespace-scope type: a nested one
// with a default member initializer is not default-constructible inside its class.)
struct FlatBufferFree {
  Device device = Device::cpu();
  std::size_t bytes = 0;  // the allocation's size
  // Memory the buffer does not own (a node-shared mapping): released with this deleter, which
  // then frees nothing itself.
  std::shared_ptr<void> mapping;
  void operator()(float* p) const {
    AbandonedMemory::process().free_or_defer(p, bytes, [device = device, mapping = mapping, p]() mutable {
      if (mapping) {
        mapping.reset();
      } else if (device.is_cuda()) {
        device::cuda_free(device, p);
      } else {
        std::free(p);
      }
    });
  }
};

class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(int64_t numel) { resize(numel); }
  // An empty buffer that resize() places on `device`. On a CUDA device the zero fill is
  // enqueued on `stream`, so work on that stream sees zeros without any device-wide sync.
  FlatBuffer(Device device, void* stream, DType dtype = DType::f32)
      : device_(device), stream_(stream), dtype_(dtype) {}
  FlatBuffer(const FlatBuffer&) = delete;
  FlatBuffer& operator=(const FlatBuffer&) = delete;
  FlatBuffer(FlatBuffer&&) = default;
  FlatBuffer& operator=(FlatBuffer&&) = default;

  // Discards the contents; keeps the buffer's device. The memory is zeroed here, so its pages
  // are touched once at allocation rather than on first use inside a step.
  void resize(int64_t numel) {
    data_.reset();
    borrowed_ = false;
    numel_ = 0;
    if (numel <= 0) return;
    const std::size_t bytes = allocation_bytes(numel, dtype_);
    if (device_.is_cuda()) {
      // cudaMalloc aligns to at least 256 bytes.
      void* p = device::cuda_allocate_zeroed(device_, bytes, stream_);
      data_ = std::shared_ptr<float>(static_cast<float*>(p), Free{device_, bytes, nullptr});
    } else {
      void* p = std::aligned_alloc(64, bytes);
      SHARDOPT_CHECK(p != nullptr, out_of_memory, "out of memory: allocating a host buffer of {} {} elements ({} bytes)",
                     numel, dtype_name(dtype_), bytes);
      std::memset(p, 0, bytes);
      data_ = std::shared_ptr<float>(static_cast<float*>(p), Free{device_, bytes, nullptr});
    }
    numel_ = numel;
  }
  // A host buffer over `numel` elements of memory someone else allocated (zero-filled, 64-byte
  // aligned, at least the rounded-up size resize() would allocate); `mapping` keeps it alive.
  static FlatBuffer over_mapping(std::shared_ptr<void> mapping, void* data, int64_t numel, DType dtype) {
    FlatBuffer buffer(Device::cpu(), nullptr, dtype);
    buffer.data_ = std::shared_ptr<float>(static_cast<float*>(data), Free{Device::cpu(), allocation_bytes(numel, dtype), std::move(mapping)});
    buffer.borrowed_ = true;
    buffer.numel_ = numel;
    return buffer;
  }
  bool borrowed() const { return borrowed_ && data_ != nullptr; }
  // Shared ownership of the memory (empty for an empty buffer): it stays allocated (or mapped)
  // until the buffer and every keeper have let go.
  std::shared_ptr<const void> keeper() const { return data_; }
  // Bytes resize() allocates for `numel` elements of `dtype`: whole cache lines.
  static std::size_t allocation_bytes(int64_t numel, DType dtype) {
    return (static_cast<std::size_t>(numel) * dtype_size(dtype) + 63) / 64 * 64;
  }

  // The elements as floats: only for f32 buffers (state, masters); raw() for any dtype.
  float* data() const { return data_.get(); }
  void* raw() const { return data_.get(); }
  // Address of element `index`, whatever the dtype.
  char* at(int64_t index) const {
    return reinterpret_cast<char*>(data_.get()) + index * static_cast<int64_t>(dtype_size(dtype_));
  }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(dtype_size(dtype_)); }
  DType dtype() const { return dtype_; }
  bool empty() const { return numel_ == 0; }
  Device device() const { return device_; }

 private:
  using Free = FlatBufferFree;
  std::shared_ptr<float> data_;
  bool borrowed_ = false;  // over a mapping someone else allocated
  Device device_ = Device::cpu();
  void* stream_ = nullptr;
  DType dtype_ = DType::f32;
  int64_t numel_ = 0;
};

}  // namespace core
}  // namespace shardopt
