// src/optim/flat_buffer.hpp — an owned, 64-byte-aligned, zero-filled host float buffer.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace shardopt {
namespace optim {

class FlatBuffer {
 public:
  FlatBuffer() = default;
  explicit FlatBuffer(int64_t numel) { resize(numel); }

  // Discards the contents. The memory is zeroed here, so its pages are touched once at
  // allocation rather than on first use inside a step.
  void resize(int64_t numel) {
    data_.reset();
    numel_ = 0;
    if (numel <= 0) return;
    const std::size_t bytes = (static_cast<std::size_t>(numel) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<float*>(p));
    numel_ = numel;
  }
  float* data() const { return data_.get(); }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }
  bool empty() const { return numel_ == 0; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t numel_ = 0;
};

}  // namespace optim
}  // namespace shardopt
