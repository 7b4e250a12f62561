// bench/src/cuda_device.hpp — the few CUDA runtime services the bench's --device cuda modes use, behind an interface without CUDA headers (cuda_device.cpp, or cuda_unavailable.cpp in a build without CUDA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace shardopt_bench {

// Exit status when --device cuda cannot run on this build or machine (no CUDA in the build,
// no usable device, no NCCL for --comm nccl): one line on rank 0 says why.
constexpr int kNoDeviceExit = 4;

// Whether this build of the bench has the CUDA runtime at all.
bool cuda_compiled_in();

// Empty when this process can use a CUDA device; otherwise why not, in one line.
std::string cuda_unusable_reason();

// Makes device (local_rank % devices) current on the calling thread; returns its index.
int use_local_device(int local_rank);

// What the roofline and the report need to know about the current device.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t l2_bytes = 0;
  int64_t memory_bytes = 0;
};
DeviceInfo current_device_info();

// Device memory (cudaMalloc), freed on scope exit. Copies block until complete.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Blocking copies between host memory and device memory (any device pointer, such as a view
// shardopt hands out); they also wait for all work already queued on the device.
void copy_to_device(void* device_dst, const void* host_src, int64_t bytes);
void copy_to_host(void* host_dst, const void* device_src, int64_t bytes);

void synchronize_device();
void synchronize_stream(void* stream);  // a cudaStream_t

// A pair of CUDA events on one stream: the device time between start() and stop().
class StreamTimer {
 public:
  StreamTimer();
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  void start(void* stream);
  void stop(void* stream);
  double seconds();  // waits for stop's event

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// Device-to-device bandwidths of the current device, in GB/s counting every byte read and
// every byte written (a copy of B bytes moves 2B), each the best of `reps` repetitions after a
// warm-up one (as STREAM), over arrays of `array_bytes` each:
//   memcpy   cudaMemcpyAsync device to device
//   copy     a vectorised grid-stride copy kernel (16-byte loads and stores)
//   update   a kernel with Adam's f32 streams: read p, g, m, v and write p, m, v (28 B/element)
struct D2DBandwidth {
  double memcpy_gbps = 0;
  double copy_gbps = 0;
  double update_gbps = 0;
  int64_t array_bytes = 0;

  double best_gbps() const { return std::max(memcpy_gbps, std::max(copy_gbps, update_gbps)); }
  const char* best_pattern() const {
    const double best = best_gbps();
    return best == memcpy_gbps ? "memcpy" : best == copy_gbps ? "copy" : "update";
  }
};
D2DBandwidth measure_d2d_bandwidth(int64_t array_bytes, int reps);

}  // namespace shardopt_bench
