// src/core/abandoned_memory.hpp — the memory that abandoned collectives may still touch, and the frees deferred until they can no longer touch it.
//
// MPI cannot cancel a nonblocking collective: one that timed out (or was dropped) stays live
// and reads and writes its buffers whenever the late peer arrives, possibly only inside
// MPI_Finalize. A communicator that abandons such a collective holds the byte ranges it uses
// here; shardopt's own allocations (FlatBuffer) free through free_or_defer(), so an allocation
// overlapping a held range is freed only once the hold is released: when the collective
// completed, or when the communication library was finalised. Memory shardopt does not own
// (the caller's buffers) cannot be kept alive here: the public headers say what the caller
// must do. Knows nothing of MPI: the communicator decides when a hold ends.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace shardopt {
namespace core {

struct ByteRange {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

class AbandonedMemory {
 public:
  using Hold = uint64_t;

  // The process's registry. Never destroyed: holds may end (and deferred frees run) from
  // static destructors, such as the MPI runtime's at exit.
  static AbandonedMemory& process();

  // Ranges that an abandoned collective may still read or write, until release(hold) or
  // release_all(). Empty ranges are ignored.
  Hold hold(const ByteRange* ranges, std::size_t count);
  // That collective has completed: runs the deferred frees that waited for it alone.
  void release(Hold hold);
  // Nothing can touch any held range any more (the communication library was finalised).
  void release_all();

  // Calls `free` now, unless [allocation, allocation + bytes) overlaps a held range: then
  // when the last hold overlapping it is released.
  template <typename Free>
  void free_or_defer(const void* allocation, std::size_t bytes, Free free) {
    // The common case (no collective ever abandoned) takes no lock and allocates nothing.
    if (holds_.load(std::memory_order_acquire) == 0 || !defer(allocation, bytes, std::function<void()>(free))) {
      free();
    }
  }

  std::size_t held_count() const;      // holds not released yet
  std::size_t deferred_count() const;  // frees waiting for a hold

 private:
  AbandonedMemory() = default;
  struct Deferred {
    ByteRange range;
    std::function<void()> free;
  };
  bool overlaps_a_hold(const ByteRange& range) const;  // under mutex_
  // Keeps `free` for later when `allocation` overlaps a held range (-> true).
  bool defer(const void* allocation, std::size_t bytes, std::function<void()> free);
  // Takes out the deferred frees that no held range overlaps any more (under mutex_); the
  // caller runs them after unlocking.
  std::vector<std::function<void()>> take_released();

  mutable std::mutex mutex_;
  std::atomic<std::size_t> holds_{0};
  Hold next_ = 1;
  std::map<Hold, std::vector<ByteRange>> held_;
  std::vector<Deferred> deferred_;
};

// Frees `buffer`'s memory once no abandoned collective can touch it: at once, unless a held
// range overlaps it (say a collective on it just failed: one that timed out stays live in MPI
// and may still write it when the late peer arrives).
template <typename T>
void free_when_untouched(std::vector<T>&& buffer) {
  auto kept = std::make_shared<std::vector<T>>(std::move(buffer));  // moving keeps the memory
  AbandonedMemory::process().free_or_defer(kept->data(), kept->size() * sizeof(T), [kept]() mutable { kept.reset(); });
}

}  // namespace core
}  // namespace shardopt
