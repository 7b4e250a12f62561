// src/checkpoint/copy_engine_cuda.cpp — the CUDA copy engine: pinned staging slots, cudaMemcpyAsync on its own stream, one event per slot (CUDA builds only).
#include <cuda_runtime.h>

#include "checkpoint/copy_engine.hpp"
#include "core/abandoned_memory.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

void check(cudaError_t status, const char* what, Device device) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error must not surface in the caller's next CUDA call
  raise(ErrorCode::cuda, "checkpoint staging: {} on {} failed: {} ({})", what, device_name(device),
        cudaGetErrorString(status), cudaGetErrorName(status));
}

// Every call scopes the engine's device: a background save's writer thread calls it too, and
// its current device is not the optimizer's.
class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(Device device, void* after_stream, std::size_t slot_bytes, std::shared_ptr<CopyStats> stats)
      : CopyEngine(slot_bytes, std::move(stats)), device_(device) {
    const device::ScopedDevice scope(device_);
    try {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", device_);
      for (int s = 0; s < kSlots; ++s) {
        check(cudaEventCreateWithFlags(&events_[s], cudaEventDisableTiming), "cudaEventCreateWithFlags", device_);
      }
      // Pinned slots: cudaMemcpyAsync from pageable memory would run synchronously.
      check(cudaHostAlloc(&pinned_, kSlots * slot_stride(slot_bytes), cudaHostAllocDefault), "cudaHostAlloc",
            device_);
      count_allocation(kSlots * slot_stride(slot_bytes));
      // The copies start after what the optimizer enqueued so far (its last step's update).
      check(cudaEventRecord(events_[0], static_cast<cudaStream_t>(after_stream)), "cudaEventRecord", device_);
      check(cudaStreamWaitEvent(stream_, events_[0], 0), "cudaStreamWaitEvent", device_);
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaCopyEngine() override { release(); }

  char* slot(int slot_index) override {
    return static_cast<char*>(pinned_) + static_cast<std::size_t>(slot_index) * slot_stride(slot_bytes());
  }
  void fence(int slot_index) override {
    const device::ScopedDevice scope(device_);
    check(cudaEventRecord(events_[slot_index], stream_), "cudaEventRecord", device_);
  }
  void wait(int slot_index) override {
    const device::ScopedDevice scope(device_);
    check(cudaEventSynchronize(events_[slot_index]), "cudaEventSynchronize", device_);
  }

 private:
  void copy_to_host(int, char* slot_dst, const void* src, std::size_t bytes) override {
    const device::ScopedDevice scope(device_);
    check(cudaMemcpyAsync(slot_dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (device to host)",
          device_);
  }
  void copy_to_device(int, void* dst, const char* slot_src, std::size_t bytes) override {
    const device::ScopedDevice scope(device_);
    check(cudaMemcpyAsync(dst, slot_src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync (host to device)",
          device_);
  }

  // Waits for copies still reading or writing the slots (an error cut a transfer short), then
  // frees everything. Never throws.
  void release() noexcept {
    try {
      const device::ScopedDevice scope(device_);
      free_all();
    } catch (...) {
      free_all();  // the device could not be made current: free what can be freed anyway
    }
  }
  void free_all() noexcept {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (pinned_ != nullptr) {
      // The slots receive consolidation's broadcasts: one that timed out may still write them.
      core::AbandonedMemory::process().free_or_defer(pinned_, kSlots * slot_stride(slot_bytes()),
                                                     [pinned = pinned_] { cudaFreeHost(pinned); });
    }
    for (cudaEvent_t& e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    pinned_ = nullptr;
    stream_ = nullptr;
    cudaGetLastError();
  }

  Device device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[kSlots] = {};
  void* pinned_ = nullptr;
};

}  // namespace

std::unique_ptr<CopyEngine> make_device_copy_engine(Device device, void* after_stream, std::size_t slot_bytes,
                                                     std::shared_ptr<CopyStats> stats) {
  return std::make_unique<CudaCopyEngine>(device, after_stream, slot_bytes, std::move(stats));
}

}  // namespace checkpoint
}  // namespace shardopt
