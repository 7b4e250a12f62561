// src/comm/communicator.cpp — the user-facing Communicator: each call handed to its transport (CommBackend), split children wrapped again.
#include <utility>

#include "core/check.hpp"
#include "shardopt/comm_backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace {

std::shared_ptr<Communicator> wrap(std::shared_ptr<CommBackend> backend) {
  return backend ? std::make_shared<Communicator>(std::move(backend)) : nullptr;
}

}  // namespace

Communicator::Communicator(std::shared_ptr<CommBackend> backend) : backend_(std::move(backend)) {
  SHARDOPT_CHECK(backend_ != nullptr, invalid_argument, "Communicator: the backend is null");
}

Communicator::~Communicator() = default;

int Communicator::rank() const { return backend_->rank(); }
int Communicator::size() const { return backend_->size(); }
Device Communicator::device() const { return backend_->device(); }
const char* Communicator::backend_name() const { return backend_->backend_name(); }
bool Communicator::cuda_aware() const { return backend_->cuda_aware(); }
void* Communicator::cuda_stream() const { return backend_->cuda_stream(); }
double Communicator::timeout_seconds() const { return backend_->timeout_seconds(); }

void Communicator::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  backend_->broadcast(buffer, count, dtype, root);
}
void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  backend_->all_gather(send, recv, count, dtype);
}
void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  backend_->reduce_scatter(send, recv, count, dtype, op);
}
void Communicator::all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) {
  backend_->all_reduce(buffer, count, dtype, op);
}
void Communicator::reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) {
  backend_->reduce(send, recv, count, dtype, op, root);
}
void Communicator::barrier() { backend_->barrier(); }

std::unique_ptr<PendingCollective> Communicator::broadcast_async(void* buffer, int64_t count, DType dtype,
                                                                 int root) {
  return backend_->broadcast_async(buffer, count, dtype, root);
}
std::unique_ptr<PendingCollective> Communicator::broadcast_group_async(const BroadcastPart* parts, std::size_t count,
                                                                       DType dtype) {
  return backend_->broadcast_group_async(parts, count, dtype);
}
std::unique_ptr<PendingCollective> Communicator::all_gather_async(const void* send, void* recv, int64_t count,
                                                                  DType dtype) {
  return backend_->all_gather_async(send, recv, count, dtype);
}
std::unique_ptr<PendingCollective> Communicator::all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                                  ReduceOp op) {
  return backend_->all_reduce_async(buffer, count, dtype, op);
}
std::unique_ptr<PendingCollective> Communicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                                                      DType dtype, ReduceOp op) {
  return backend_->reduce_scatter_async(send, recv, count, dtype, op);
}
std::unique_ptr<PendingCollective> Communicator::reduce_async(const void* send, void* recv, int64_t count,
                                                              DType dtype, ReduceOp op, int root) {
  return backend_->reduce_async(send, recv, count, dtype, op, root);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) { return wrap(backend_->split(color, key)); }
std::shared_ptr<Communicator> Communicator::split_node() { return wrap(backend_->split_node()); }

std::shared_ptr<CommBackend> backend_of(const Communicator& comm) { return comm.backend_; }

}  // namespace shardopt
