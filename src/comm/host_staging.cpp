// src/comm/host_staging.cpp — host buffers staged through device scratch for a device-memory communicator.
#include "comm/host_staging.hpp"

#include "core/check.hpp"

namespace shardopt {
namespace comm {
namespace {

class Completed final : public PendingCollective {
 public:
  void wait() override {}
};

std::size_t byte_count(int64_t count, DType dtype, const char* op) {
  SHARDOPT_CHECK(count >= 0, invalid_argument, "{}: negative count {}", op, count);
  return static_cast<std::size_t>(count) * dtype_size(dtype);
}

// Refused before anything is staged: the inner communicator would refuse it too, after copies.
void check_reducible(DType dtype, const char* op) {
  SHARDOPT_CHECK(dtype != DType::byte, unsupported,
                 "host-staged {} cannot reduce dtype byte: byte is raw bytes that collectives "
                 "move (broadcast, all_gather) without arithmetic; reductions take f32, bf16 "
                 "and f16",
                 op);
}

}  // namespace

HostStagedBackend::HostStagedBackend(Communicator& inner, Device device, void* stream)
    : inner_(inner), device_(device), stream_(stream), scratch_(device, stream) {}

char* HostStagedBackend::scratch(std::size_t bytes) {
  const auto numel = static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
  // Grows only: these collectives are agreement records of a few hundred bytes, or a
  // consolidation's chunks of one checkpoint staging slot (a few MiB), and a reallocation
  // costs a cudaFree.
  if (numel > scratch_.numel()) scratch_.resize(numel);
  return reinterpret_cast<char*>(scratch_.data());
}

void HostStagedBackend::to_device(void* dst, const void* src, std::size_t bytes) {
  device::cuda_copy(dst, src, bytes, stream_, device_);
}

void HostStagedBackend::to_host(void* dst, const void* src, std::size_t bytes) {
  device::cuda_copy(dst, src, bytes, stream_, device_);
  device::cuda_synchronize(stream_, device_, "host-staged collective");
}

void HostStagedBackend::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  const std::size_t bytes = byte_count(count, dtype, "broadcast");
  const device::ScopedDevice scope(device_);
  char* staged = scratch(bytes);
  to_device(staged, buffer, bytes);
  inner_.broadcast(staged, count, dtype, root);
  to_host(buffer, staged, bytes);
}

void HostStagedBackend::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  const std::size_t bytes = byte_count(count, dtype, "all_gather");
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  const device::ScopedDevice scope(device_);
  char* staged = scratch(total);
  char* own = staged + bytes * static_cast<std::size_t>(rank());
  to_device(own, send, bytes);
  inner_.all_gather(own, staged, count, dtype);
  to_host(recv, staged, total);
}

void HostStagedBackend::reduce_scatter(const void* send, void* recv, int64_t count,
                                            DType dtype, ReduceOp op) {
  check_reducible(dtype, "reduce_scatter");
  const std::size_t bytes = byte_count(count, dtype, "reduce_scatter");
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  const device::ScopedDevice scope(device_);
  char* staged = scratch(total + bytes);
  to_device(staged, send, total);
  inner_.reduce_scatter(staged, staged + total, count, dtype, op);
  to_host(recv, staged + total, bytes);
}

void HostStagedBackend::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, "all_reduce");
  const std::size_t bytes = byte_count(count, dtype, "all_reduce");
  const device::ScopedDevice scope(device_);
  char* staged = scratch(bytes);
  to_device(staged, buffer, bytes);
  inner_.all_reduce(staged, count, dtype, op);
  to_host(buffer, staged, bytes);
}

void HostStagedBackend::reduce(const void* send, void* recv, int64_t count, DType dtype,
                                    ReduceOp op, int root) {
  check_reducible(dtype, "reduce");
  const std::size_t bytes = byte_count(count, dtype, "reduce");
  const device::ScopedDevice scope(device_);
  // One staged buffer, reduced in place on the root: the inner communicator sees send == recv
  // there, and non-roots only send.
  char* staged = scratch(bytes);
  to_device(staged, send, bytes);
  inner_.reduce(staged, staged, count, dtype, op, root);
  if (rank() == root) {
    to_host(recv, staged, bytes);
  } else {
    // Nothing to copy back, but the collective must be done before the scratch is reused.
    device::cuda_synchronize(stream_, device_, "host-staged collective");
  }
}

std::unique_ptr<PendingCollective> HostStagedBackend::broadcast_async(void* buffer,
                                                                           int64_t count,
                                                                           DType dtype, int root) {
  broadcast(buffer, count, dtype, root);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> HostStagedBackend::all_gather_async(const void* send,
                                                                            void* recv,
                                                                            int64_t count,
                                                                            DType dtype) {
  all_gather(send, recv, count, dtype);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> HostStagedBackend::all_reduce_async(void* buffer,
                                                                            int64_t count,
                                                                            DType dtype,
                                                                            ReduceOp op) {
  all_reduce(buffer, count, dtype, op);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> HostStagedBackend::reduce_scatter_async(const void* send,
                                                                                void* recv,
                                                                                int64_t count,
                                                                                DType dtype,
                                                                                ReduceOp op) {
  reduce_scatter(send, recv, count, dtype, op);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> HostStagedBackend::reduce_async(const void* send, void* recv,
                                                                        int64_t count, DType dtype,
                                                                        ReduceOp op, int root) {
  reduce(send, recv, count, dtype, op, root);
  return std::make_unique<Completed>();
}

std::shared_ptr<CommBackend> HostStagedBackend::split(int, int) {
  raise(ErrorCode::internal, "the optimizer's host-staging view of the '{}' communicator cannot be split",
        inner_.backend_name());
}

}  // namespace comm
}  // namespace shardopt
