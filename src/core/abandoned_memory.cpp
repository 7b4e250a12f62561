// src/core/abandoned_memory.cpp — the process's registry of memory held by abandoned collectives, and the deferred frees.
#include "core/abandoned_memory.hpp"

#include <functional>

namespace shardopt {
namespace core {
namespace {

bool overlap(const ByteRange& a, const ByteRange& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  // As integers: comparing pointers into different allocations is unspecified.
  const auto a_lo = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b_lo = reinterpret_cast<std::uintptr_t>(b.data);
  return a_lo < b_lo + b.bytes && b_lo < a_lo + a.bytes;
}

void run_all(std::vector<std::function<void()>>& frees) {
  for (std::function<void()>& free : frees) free();
}

}  // namespace

AbandonedMemory& AbandonedMemory::process() {
  // Leaked on purpose: see the declaration.
  static AbandonedMemory* const registry = new AbandonedMemory();
  return *registry;
}

AbandonedMemory::Hold AbandonedMemory::hold(const ByteRange* ranges, std::size_t count) {
  std::vector<ByteRange> kept;
  for (std::size_t i = 0; i < count; ++i) {
    if (ranges[i].data != nullptr && ranges[i].bytes > 0) kept.push_back(ranges[i]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const Hold id = next_++;
  held_.emplace(id, std::move(kept));
  holds_.store(held_.size(), std::memory_order_release);
  return id;
}

void AbandonedMemory::release(Hold hold) {
  std::vector<std::function<void()>> frees;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_.erase(hold) == 0) return;
    holds_.store(held_.size(), std::memory_order_release);
    frees = take_released();
  }
  run_all(frees);
}

void AbandonedMemory::release_all() {
  std::vector<std::function<void()>> frees;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.clear();
    holds_.store(0, std::memory_order_release);
    frees = take_released();
  }
  run_all(frees);
}

std::size_t AbandonedMemory::held_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.size();
}

std::size_t AbandonedMemory::deferred_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return deferred_.size();
}

bool AbandonedMemory::overlaps_a_hold(const ByteRange& range) const {
  for (const auto& entry : held_) {
    for (const ByteRange& held : entry.second) {
      if (overlap(range, held)) return true;
    }
  }
  return false;
}

bool AbandonedMemory::defer(const void* allocation, std::size_t bytes, std::function<void()> free) {
  const ByteRange range{allocation, bytes};
  std::lock_guard<std::mutex> lock(mutex_);
  if (!overlaps_a_hold(range)) return false;
  deferred_.push_back(Deferred{range, std::move(free)});
  return true;
}

std::vector<std::function<void()>> AbandonedMemory::take_released() {
  std::vector<std::function<void()>> frees;
  std::vector<Deferred> still;
  for (Deferred& d : deferred_) {
    if (overlaps_a_hold(d.range)) {
      still.push_back(std::move(d));
    } else {
      frees.push_back(std::move(d.free));
    }
  }
  deferred_ = std::move(still);
  return frees;
}

}  // namespace core
}  // namespace shardopt
