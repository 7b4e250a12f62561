// src/checkpoint/copy_engine.hpp — byte copies between a checkpoint's staging slots (host) and the optimizer's memory (host or a CUDA device), behind one interface.
//
// Checkpoints move state between the optimizer's buffers and files or state dicts through two
// host staging slots of a few MiB each, never through a host copy of a whole shard. Only this
// interface knows where the optimizer's memory is: the host implementation copies with memcpy
// (and is what the CPU tests drive through the very same staging code), the CUDA one
// (copy_engine_cuda.cpp, CUDA builds only) enqueues cudaMemcpyAsync on its own stream between
// the device and pinned slots, and orders the two slots with events. No CUDA header here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardopt/types.hpp"

namespace shardopt {
namespace checkpoint {

// What an engine did, for tests and reports: every copy call and its size, and the staging
// memory it allocated (the bound a checkpoint's host memory overhead obeys).
struct CopyStats {
  int64_t to_host_calls = 0;
  int64_t to_device_calls = 0;
  int64_t bytes_copied = 0;
  int64_t max_call_bytes = 0;  // never more than slot_bytes
  int64_t staging_bytes = 0;   // host staging allocated by engines (kSlots * slot_stride each)
  int64_t engines = 0;         // engines created with these stats
};

class CopyEngine {
 public:
  static constexpr int kSlots = 2;  // double buffering: one slot copies while the other is used

  CopyEngine(std::size_t slot_bytes, std::shared_ptr<CopyStats> stats);
  virtual ~CopyEngine() = default;
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  std::size_t slot_bytes() const { return slot_bytes_; }
  // Distance between the slots in an engine's allocation: whole cache lines, so that each slot
  // starts aligned for any element whatever slot_bytes is.
  static std::size_t slot_stride(std::size_t slot_bytes) { return (slot_bytes + 63) / 64 * 64; }
  // Host memory of slot `slot` (pinned on a CUDA engine), slot_bytes() long.
  virtual char* slot(int slot) = 0;

  // Enqueue a copy between the optimizer's memory and a range of slot `slot`; both return at
  // once on a CUDA engine. The copies of a slot have finished once wait(slot) returns after a
  // fence(slot) that follows them.
  void to_host(int slot, char* slot_dst, const void* src, std::size_t bytes);
  void to_device(int slot, void* dst, const char* slot_src, std::size_t bytes);
  virtual void fence(int slot) = 0;
  virtual void wait(int slot) = 0;

 protected:
  virtual void copy_to_host(int slot, char* slot_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_device(int slot, void* dst, const char* slot_src, std::size_t bytes) = 0;
  void count_allocation(std::size_t bytes);

 private:
  void check_range(int slot, const char* at, std::size_t bytes, const char* what);
  void count_call(std::size_t bytes);

  std::size_t slot_bytes_;
  std::shared_ptr<CopyStats> stats_;  // may be null
};

// memcpy between host slots and host memory.
std::unique_ptr<CopyEngine> make_host_copy_engine(std::size_t slot_bytes, std::shared_ptr<CopyStats> stats);
// cudaMemcpyAsync between pinned slots and `device`'s memory, on a stream of its own that starts
// after the work enqueued on `after_stream` so far (the optimizer's stream). Destroying it waits
// for its copies. Error(unsupported) in a build without CUDA.
std::unique_ptr<CopyEngine> make_device_copy_engine(Device device, void* after_stream, std::size_t slot_bytes,
                                                     std::shared_ptr<CopyStats> stats);

}  // namespace checkpoint
}  // namespace shardopt
