// bench/src/cuda_unavailable.cpp — cuda_device.hpp in a build without CUDA: the bench says so and never reaches a device call.
#include "cuda_device.hpp"

#include <stdexcept>

namespace shardopt_bench {

namespace {
[[noreturn]] void no_cuda() { throw std::runtime_error("this build of shardopt-bench has no CUDA support"); }
}  // namespace

bool cuda_compiled_in() { return false; }

std::string cuda_unusable_reason() {
  return "this build of shardopt-bench has no CUDA support (configure with -DSHARDOPT_WITH_CUDA=ON)";
}

int use_local_device(int) { no_cuda(); }
DeviceInfo current_device_info() { no_cuda(); }
DeviceBuffer::DeviceBuffer(int64_t bytes) : bytes_(bytes) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
void copy_to_device(void*, const void*, int64_t) { no_cuda(); }
void copy_to_host(void*, const void*, int64_t) { no_cuda(); }
void synchronize_device() { no_cuda(); }
void synchronize_stream(void*) { no_cuda(); }
StreamTimer::StreamTimer() { no_cuda(); }
StreamTimer::~StreamTimer() = default;
void StreamTimer::start(void*) { no_cuda(); }
void StreamTimer::stop(void*) { no_cuda(); }
double StreamTimer::seconds() { no_cuda(); }
D2DBandwidth measure_d2d_bandwidth(int64_t, int) { no_cuda(); }

}  // namespace shardopt_bench
