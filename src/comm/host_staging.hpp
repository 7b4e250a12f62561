// src/comm/host_staging.hpp — a host-memory view of a device-memory communicator, for small host-side collectives (the agreement records).
//
// A NCCL communicator takes device buffers only, but the agreement records every collective
// call starts with (comm/agreement.hpp) are host data (about a kilobyte). This adapter stages them
// through a device scratch buffer: host -> device copy, the collective, device -> host copy,
// all on the communicator's stream, then waits for that stream (these results are needed on
// the host right away). It never touches the optimizer's own buffers.
#pragma once

#include <memory>

#include "core/flat_buffer.hpp"
#include "shardopt/comm_backend.hpp"

namespace shardopt {
namespace comm {

class HostStagedBackend final : public CommBackend {
 public:
  // `inner` works on device memory of `device` and issues its collectives on `stream`; it must
  // outlive this adapter.
  HostStagedBackend(Communicator& inner, Device device, void* stream);

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return Device::cpu(); }
  const char* backend_name() const override { return inner_.backend_name(); }
  // A host view: its callers pass host buffers, and it synchronises before returning.
  bool cuda_aware() const override { return false; }
  void* cuda_stream() const override { return nullptr; }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override;
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                      ReduceOp op) override;
  void all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) override;
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
              int root) override;
  void barrier() override { inner_.barrier(); }

  // Staged collectives finish before they return; the handles only report that.
  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype,
                                                     int root) override;
  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override;
  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override;
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                          int64_t count, DType dtype,
                                                          ReduceOp op) override;
  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                  DType dtype, ReduceOp op, int root) override;
  std::shared_ptr<CommBackend> split(int color, int key) override;

 private:
  char* scratch(std::size_t bytes);
  void to_device(void* dst, const void* src, std::size_t bytes);
  void to_host(void* dst, const void* src, std::size_t bytes);

  Communicator& inner_;
  Device device_;
  void* stream_;
  core::FlatBuffer scratch_;
};

}  // namespace comm
}  // namespace shardopt
