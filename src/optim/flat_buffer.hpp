// src/optim/flat_buffer.hpp — an owned, 64-byte-aligned, zero-filled float buffer in host memory or on a CUDA device.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "core/device_memory.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace optim {

// Frees with the allocator that matches the memory's device. (A namespace-scope type: a
// nested one with a default member initializer is not default-constructible inside its class.)
struct FlatBufferFree {
  Device device = Device::cpu();
  void operator()(float* p) const {
    if (device.is_cuda()) {
      device::cuda_free(device, p);
    } else {
      std::free(p);
    }
  }
};

class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(int64_t numel) { resize(numel); }
  // An empty buffer that resize() places on `device`. On a CUDA device the zero fill is
  // enqueued on `stream`, so work on that stream sees zeros without any device-wide sync.
  FlatBuffer(Device device, void* stream) : device_(device), stream_(stream) {}

  // Discards the contents; keeps the buffer's device. The memory is zeroed here, so its pages
  // are touched once at allocation rather than on first use inside a step.
  void resize(int64_t numel) {
    data_.reset();
    numel_ = 0;
    if (numel <= 0) return;
    const std::size_t bytes = (static_cast<std::size_t>(numel) * sizeof(float) + 63) / 64 * 64;
    if (device_.is_cuda()) {
      // cudaMalloc aligns to at least 256 bytes.
      void* p = device::cuda_allocate_zeroed(device_, bytes, stream_);
      data_ = std::unique_ptr<float, Free>(static_cast<float*>(p), Free{device_});
    } else {
      void* p = std::aligned_alloc(64, bytes);
      if (p == nullptr) throw std::bad_alloc();
      std::memset(p, 0, bytes);
      data_ = std::unique_ptr<float, Free>(static_cast<float*>(p), Free{device_});
    }
    numel_ = numel;
  }
  float* data() const { return data_.get(); }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }
  bool empty() const { return numel_ == 0; }
  Device device() const { return device_; }

 private:
  using Free = FlatBufferFree;
  std::unique_ptr<float, Free> data_;
  Device device_ = Device::cpu();
  void* stream_ = nullptr;
  int64_t numel_ = 0;
};

}  // namespace optim
}  // namespace shardopt
