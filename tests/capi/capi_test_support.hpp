// tests/capi/capi_test_support.hpp — hand-built DLPack tensors that count their deleter calls, and a C ABI world communicator for the C ABI tests.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/shardopt.h"

namespace shardopt_capi_test {

inline std::string last_error() { return shardopt_last_error(); }

// A float32 tensor of `shape` over its own storage (`capacity` floats, or as many as the shape
// needs), on the CPU, compact, writable, DLPack 1.x. Tests change fields to make it wrong.
// Its deleter counts calls in `deletes` and frees nothing (the storage is this object's).
struct FakeTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::vector<float> storage;
  DLManagedTensorVersioned managed{};
  int deletes = 0;

  explicit FakeTensor(std::vector<int64_t> dims, int64_t capacity = -1) : shape(std::move(dims)) {
    // Storage for the elements, capped: shapes too large to allocate are only ever refused.
    constexpr int64_t kCap = int64_t{1} << 16;
    int64_t numel = 1;
    for (int64_t d : shape) numel = d <= 0 ? 0 : std::min(kCap, numel * std::min(kCap, d));
    storage.assign(static_cast<std::size_t>(capacity >= 0 ? capacity : numel), 0.0f);
    managed.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensorVersioned* self) { ++static_cast<FakeTensor*>(self->manager_ctx)->deletes; };
    managed.flags = 0;
    DLTensor& t = managed.dl_tensor;
    t.data = storage.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = DLDataType{kDLFloat, 32, 1};
    t.shape = shape.empty() ? nullptr : shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  FakeTensor(const FakeTensor&) = delete;
  FakeTensor& operator=(const FakeTensor&) = delete;

  void set_strides(std::vector<int64_t> s) {
    strides = std::move(s);
    managed.dl_tensor.strides = strides.data();
  }
};

// shardopt_comm_world() for one test, destroyed at its end. MPI itself is initialised once by
// the test runner (tests/mpi/mpi_test_main.cpp), so this shares it. A positive
// `timeout_seconds` replaces the default collective timeout (a regression fails fast).
class CommHandle {
 public:
  explicit CommHandle(double timeout_seconds = 0) {
    shardopt_comm_options options;
    shardopt_comm_options_init(&options);
    if (timeout_seconds > 0) options.timeout_seconds = timeout_seconds;
    REQUIRE(shardopt_comm_world(&options, &comm_) == SHARDOPT_OK);
  }
  ~CommHandle() { shardopt_comm_destroy(comm_); }
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  shardopt_comm_t get() const { return comm_; }
  int rank() const {
    int r = -1;
    shardopt_comm_rank(comm_, &r);
    return r;
  }
  int size() const {
    int s = -1;
    shardopt_comm_size(comm_, &s);
    return s;
  }

 private:
  shardopt_comm_t comm_ = nullptr;
};

}  // namespace shardopt_capi_test
