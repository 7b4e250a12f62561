// src/checkpoint/copy_engine.cpp — the copy engine's bookkeeping and its host implementation (memcpy).
#include "checkpoint/copy_engine.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/abandoned_memory.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {

CopyEngine::CopyEngine(std::size_t slot_bytes, std::shared_ptr<CopyStats> stats)
    : slot_bytes_(slot_bytes), stats_(std::move(stats)) {
  SHARDOPT_CHECK(slot_bytes_ >= sizeof(float), internal, "checkpoint staging slots of {} bytes cannot hold one element",
                 slot_bytes_);
  if (stats_) stats_->engines += 1;
}

void CopyEngine::check_range(int slot_index, const char* at, std::size_t bytes, const char* what) {
  SHARDOPT_CHECK(slot_index >= 0 && slot_index < kSlots, internal, "{}: no staging slot {}", what, slot_index);
  const char* base = slot(slot_index);
  SHARDOPT_CHECK(at >= base && bytes <= slot_bytes_ && at + bytes <= base + slot_bytes_, internal,
                 "{}: {} bytes at offset {} overrun staging slot {} of {} bytes", what, bytes, at - base, slot_index,
                 slot_bytes_);
}

void CopyEngine::count_call(std::size_t bytes) {
  if (!stats_) return;
  stats_->bytes_copied += static_cast<int64_t>(bytes);
  stats_->max_call_bytes = std::max(stats_->max_call_bytes, static_cast<int64_t>(bytes));
}

void CopyEngine::count_allocation(std::size_t bytes) {
  if (stats_) stats_->staging_bytes += static_cast<int64_t>(bytes);
}

void CopyEngine::to_host(int slot_index, char* slot_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_range(slot_index, slot_dst, bytes, "checkpoint staging (to host)");
  if (stats_) stats_->to_host_calls += 1;
  count_call(bytes);
  copy_to_host(slot_index, slot_dst, src, bytes);
}

void CopyEngine::to_device(int slot_index, void* dst, const char* slot_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_range(slot_index, slot_src, bytes, "checkpoint staging (to device)");
  if (stats_) stats_->to_device_calls += 1;
  count_call(bytes);
  copy_to_device(slot_index, dst, slot_src, bytes);
}

namespace {

// Copies complete when called: fence and wait have nothing to do.
class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(std::size_t slot_bytes, std::shared_ptr<CopyStats> stats)
      : CopyEngine(slot_bytes, std::move(stats)) {
    try {
      memory_.resize(kSlots * slot_stride(slot_bytes) / 64);
    } catch (const std::exception&) {  // bad_alloc, or length_error beyond what a vector can hold
      raise(ErrorCode::out_of_memory, "out of memory: allocating two checkpoint staging slots of {} bytes",
            slot_bytes);
    }
    count_allocation(memory_.size() * 64);
  }
  // The slots receive consolidation's broadcasts: one that timed out may still write them.
  ~HostCopyEngine() override { core::free_when_untouched(std::move(memory_)); }
  char* slot(int slot_index) override {
    return reinterpret_cast<char*>(memory_.data()) + static_cast<std::size_t>(slot_index) * slot_stride(slot_bytes());
  }
  void fence(int) override {}
  void wait(int) override {}

 private:
  void copy_to_host(int, char* slot_dst, const void* src, std::size_t bytes) override {
    std::memcpy(slot_dst, src, bytes);
  }
  void copy_to_device(int, void* dst, const char* slot_src, std::size_t bytes) override {
    std::memcpy(dst, slot_src, bytes);
  }

  // Cache lines, so that the slots are 64-byte aligned as the CUDA engine's pinned ones.
  struct alignas(64) Line {
    char bytes[64];
  };
  std::vector<Line> memory_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_host_copy_engine(std::size_t slot_bytes, std::shared_ptr<CopyStats> stats) {
  return std::make_unique<HostCopyEngine>(slot_bytes, std::move(stats));
}

#if !SHARDOPT_HAVE_CUDA
std::unique_ptr<CopyEngine> make_device_copy_engine(Device device, void*, std::size_t, std::shared_ptr<CopyStats>) {
  raise(ErrorCode::unsupported, "checkpoint staging for {}: this build of shardopt has no CUDA support",
        device_name(device));
}
#endif

}  // namespace checkpoint
}  // namespace shardopt
