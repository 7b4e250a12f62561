// src/comm/comm_backend.cpp — CommBackend's optional calls: blocking collectives as start + wait, and a broadcast group started one by one.
#include <utility>
#include <vector>

#include "shardopt/comm_backend.hpp"

namespace shardopt {
namespace {

class PendingGroup final : public PendingCollective {
 public:
  explicit PendingGroup(std::vector<std::unique_ptr<PendingCollective>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& part : parts_) part->wait();
    parts_.clear();
  }

 private:
  std::vector<std::unique_ptr<PendingCollective>> parts_;
};

}  // namespace

void CommBackend::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  broadcast_async(buffer, count, dtype, root)->wait();
}

void CommBackend::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  all_gather_async(send, recv, count, dtype)->wait();
}

void CommBackend::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  reduce_scatter_async(send, recv, count, dtype, op)->wait();
}

void CommBackend::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) {
  all_reduce_async(buffer, count, dtype, op)->wait();
}

void CommBackend::reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) {
  reduce_async(send, recv, count, dtype, op, root)->wait();
}

std::unique_ptr<PendingCollective> CommBackend::broadcast_group_async(const BroadcastPart* parts, std::size_t count,
                                                                      DType dtype) {
  std::vector<std::unique_ptr<PendingCollective>> started;
  started.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    started.push_back(broadcast_async(parts[i].buffer, parts[i].count, dtype, parts[i].root));
  }
  return std::make_unique<PendingGroup>(std::move(started));
}

}  // namespace shardopt
