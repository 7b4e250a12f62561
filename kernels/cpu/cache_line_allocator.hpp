// kernels/cpu/cache_line_allocator.hpp — a std::vector allocator whose storage starts on a 64-byte cache line.
//
// std::vector's large blocks (glibc's mmap'd chunks) start 16 bytes past a line, so every
// 64-byte vector load or tile row from them straddles two lines. The AMX product's tile loop took
// 1.75x as long at 1024^3 on such operands; its fp32 inputs and outputs cost 3-7% more.
#pragma once

#include <cstddef>
#include <new>

namespace shardopt {
namespace kernels {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t count) { return static_cast<T*>(::operator new(count * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

}  // namespace kernels
}  // namespace shardopt
