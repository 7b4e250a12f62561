// kernels/cuda/launch_cache.hpp — launch parameters (device, SM count, each kernel's resident blocks per SM) queried once and kept by their owner.
//
// Plain C++ (no CUDA headers), so that an optimizer can own one in any build. The occupancy
// calculator's answer for a given kernel on a given device never changes, and neither does the
// device's SM count, so asking the runtime on every launch only adds host latency to a step:
// the owner (one per optimizer, bound to its one device) passes its cache to the *_cuda calls,
// which fill a slot on first use and read it afterwards. A null cache queries every time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace shardopt {
namespace kernels {

// Which kernel a slot belongs to: one per (op, element format, rounding, optional state) that
// the dispatch in mixed_kernels.cu can pick.
enum class LaunchKernel : int { sgd = 0, adam = 1, widen = 2, narrow = 3, divide = 4 };

class LaunchCache {
 public:
  static constexpr int kSlots = 5 * 3 * 2 * 2;  // kernel x dtype x stochastic x flag

  static int slot(LaunchKernel kernel, int dtype_index, bool stochastic, bool flag) {
    return ((static_cast<int>(kernel) * 3 + dtype_index) * 2 + (stochastic ? 1 : 0)) * 2 + (flag ? 1 : 0);
  }

  // The device the cache describes (-1 until the first query fills it).
  int device() const { return device_; }
  int sms() const { return sms_; }
  void set_device(int device, int sms) {
    device_ = device;
    sms_ = sms;
  }
  // 0: not queried yet.
  int blocks_per_sm(int slot) const { return blocks_[static_cast<std::size_t>(slot)]; }
  void set_blocks_per_sm(int slot, int blocks) { blocks_[static_cast<std::size_t>(slot)] = blocks; }
  // How many runtime queries filled this cache (device/SM count and occupancy): a test can see
  // that later launches asked nothing.
  int64_t queries() const { return queries_; }
  void count_query() { ++queries_; }

 private:
  int device_ = -1;
  int sms_ = 0;
  std::array<int, kSlots> blocks_{};
  int64_t queries_ = 0;
};

}  // namespace kernels
}  // namespace shardopt
