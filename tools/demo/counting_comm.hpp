// tools/demo/counting_comm.hpp — a transport (CommBackend) that forwards every call and counts the payload bytes this rank hands to collectives.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "shardopt/comm_backend.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

// Shared by a communicator and every group split from it, so one number covers all the
// collectives an optimizer issues (its node and cross-node groups included). Atomic because
// an optimizer may issue collectives from its own threads.
struct ByteCounter {
  std::atomic<int64_t> bytes{0};
};

// What a collective call adds to the counter: this rank's own contribution to a collective of
// more than one rank, in bytes of f32/bf16/f16 payload. all_reduce, reduce, all_gather: count
// elements; reduce_scatter: its whole send buffer (size() * count); broadcast: count on the
// root, nothing elsewhere (the others only receive). DType::byte collectives (the agreement
// records, checkpoint objects) are control traffic and not counted, nor are barriers.
class CountingCommunicator final : public shardopt::CommBackend {
 public:
  CountingCommunicator(std::shared_ptr<shardopt::Communicator> inner, std::shared_ptr<ByteCounter> counter)
      : inner_(std::move(inner)), counter_(std::move(counter)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  shardopt::Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  bool cuda_aware() const override { return inner_->cuda_aware(); }
  void* cuda_stream() const override { return inner_->cuda_stream(); }
  void require_serialized_calls() const override { shardopt::backend_of(*inner_)->require_serialized_calls(); }

  void broadcast(void* buffer, int64_t count, shardopt::DType dtype, int root) override;
  void all_gather(const void* send, void* recv, int64_t count, shardopt::DType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, shardopt::DType dtype,
                      shardopt::ReduceOp op) override;
  void all_reduce(void* buffer, int64_t count, shardopt::DType dtype, shardopt::ReduceOp op) override;
  void reduce(const void* send, void* recv, int64_t count, shardopt::DType dtype, shardopt::ReduceOp op,
              int root) override;
  void barrier() override { inner_->barrier(); }

  std::unique_ptr<shardopt::PendingCollective> broadcast_async(void* buffer, int64_t count,
                                                               shardopt::DType dtype, int root) override;
  std::unique_ptr<shardopt::PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                                shardopt::DType dtype) override;
  std::unique_ptr<shardopt::PendingCollective> all_reduce_async(void* buffer, int64_t count,
                                                                shardopt::DType dtype,
                                                                shardopt::ReduceOp op) override;
  std::unique_ptr<shardopt::PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                                    int64_t count, shardopt::DType dtype,
                                                                    shardopt::ReduceOp op) override;
  std::unique_ptr<shardopt::PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                            shardopt::DType dtype, shardopt::ReduceOp op,
                                                            int root) override;

  // The new groups count into the same counter.
  std::shared_ptr<shardopt::CommBackend> split(int color, int key) override;
  std::shared_ptr<shardopt::CommBackend> split_node() override;

 private:
  void count(int64_t elements, shardopt::DType dtype);

  std::shared_ptr<shardopt::Communicator> inner_;
  std::shared_ptr<ByteCounter> counter_;
};

}  // namespace shardopt_demo
