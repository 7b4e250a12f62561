// tests/gpu/gpu_test_support.hpp — device detection for skipping, and a small RAII device array, for the GPU tests.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <catch2/catch.hpp>

#include <cstdio>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt_test {

// CTest's SKIP_RETURN_CODE for the gpu-labelled tests (see tests/gpu/CMakeLists.txt).
constexpr int kSkipExitCode = 77;

// True when a CUDA device can be used; otherwise `reason` says why (cudaGetErrorString).
inline bool cuda_device_present(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *reason = cudaGetErrorString(status);
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    *reason = "cudaGetDeviceCount reported 0 devices";
    return false;
  }
  return true;
}

// This rank's place on its node, and whether every node has a CUDA device per rank (NCCL's
// rule). Collective over `world`: every rank gets the same `enough_devices`, and rank 0 prints
// the SKIPPED line when there are too few.
struct NodePlacement {
  int local_rank = 0;
  int local_size = 1;
  int devices = 0;
  bool enough_devices = false;
};
inline NodePlacement node_placement(shardopt::Communicator& world) {
  NodePlacement placement;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &placement.local_rank);
  MPI_Comm_size(node, &placement.local_size);
  MPI_Comm_free(&node);
  cudaGetDeviceCount(&placement.devices);
  float short_of_devices = placement.local_size > placement.devices ? 1.f : 0.f;
  world.all_reduce(&short_of_devices, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  placement.enough_devices = short_of_devices == 0.f;
  if (!placement.enough_devices && world.rank() == 0) {
    std::printf("SKIPPED: %d ranks per node but only %d CUDA device(s); one per rank is needed\n",
                placement.local_size, placement.devices);
  }
  return placement;
}

// Device memory for `n` elements of T, freed on scope exit; failures fail the test.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)) == cudaSuccess);
    data_ = static_cast<T*>(p);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return data_; }
  std::size_t size() const { return n_; }

  void upload(const std::vector<T>& values, std::size_t offset = 0) {
    REQUIRE(offset + values.size() <= n_);
    if (values.empty()) return;
    REQUIRE(cudaMemcpy(data_ + offset, values.data(), values.size() * sizeof(T),
                       cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download(std::size_t offset, std::size_t count) {
    REQUIRE(offset + count <= n_);
    std::vector<T> values(count);
    if (count == 0) return values;
    REQUIRE(cudaMemcpy(values.data(), data_ + offset, count * sizeof(T),
                       cudaMemcpyDeviceToHost) == cudaSuccess);
    return values;
  }

 private:
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

// A stream made for one test and destroyed after it.
class TestStream {
 public:
  TestStream() { REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void* opaque() const { return static_cast<void*>(stream_); }
  void sync() const { REQUIRE(cudaStreamSynchronize(stream_) == cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace shardopt_test
