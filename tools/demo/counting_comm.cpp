// tools/demo/counting_comm.cpp — forwarding each collective to the wrapped communicator after counting its payload.
#include "counting_comm.hpp"

#include <memory>
#include <utility>

namespace shardopt_demo {

using shardopt::CommBackend;
using shardopt::Communicator;
using shardopt::DType;
using shardopt::PendingCollective;
using shardopt::ReduceOp;

void CountingCommunicator::count(int64_t elements, DType dtype) {
  // A group of one exchanges nothing, whatever it is asked to do.
  if (dtype == DType::byte || inner_->size() < 2) return;
  counter_->bytes += elements * static_cast<int64_t>(shardopt::dtype_size(dtype));
}

void CountingCommunicator::broadcast(void* buffer, int64_t n, DType dtype, int root) {
  if (root == rank()) count(n, dtype);
  inner_->broadcast(buffer, n, dtype, root);
}

void CountingCommunicator::all_gather(const void* send, void* recv, int64_t n, DType dtype) {
  count(n, dtype);
  inner_->all_gather(send, recv, n, dtype);
}

void CountingCommunicator::reduce_scatter(const void* send, void* recv, int64_t n, DType dtype,
                                          ReduceOp op) {
  count(n * size(), dtype);
  inner_->reduce_scatter(send, recv, n, dtype, op);
}

void CountingCommunicator::all_reduce(void* buffer, int64_t n, DType dtype, ReduceOp op) {
  count(n, dtype);
  inner_->all_reduce(buffer, n, dtype, op);
}

void CountingCommunicator::reduce(const void* send, void* recv, int64_t n, DType dtype, ReduceOp op,
                                  int root) {
  count(n, dtype);
  inner_->reduce(send, recv, n, dtype, op, root);
}

std::unique_ptr<PendingCollective> CountingCommunicator::broadcast_async(void* buffer, int64_t n,
                                                                         DType dtype, int root) {
  if (root == rank()) count(n, dtype);
  return inner_->broadcast_async(buffer, n, dtype, root);
}

std::unique_ptr<PendingCollective> CountingCommunicator::all_gather_async(const void* send, void* recv,
                                                                          int64_t n, DType dtype) {
  count(n, dtype);
  return inner_->all_gather_async(send, recv, n, dtype);
}

std::unique_ptr<PendingCollective> CountingCommunicator::all_reduce_async(void* buffer, int64_t n,
                                                                          DType dtype, ReduceOp op) {
  count(n, dtype);
  return inner_->all_reduce_async(buffer, n, dtype, op);
}

std::unique_ptr<PendingCollective> CountingCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                                              int64_t n, DType dtype,
                                                                              ReduceOp op) {
  count(n * size(), dtype);
  return inner_->reduce_scatter_async(send, recv, n, dtype, op);
}

std::unique_ptr<PendingCollective> CountingCommunicator::reduce_async(const void* send, void* recv,
                                                                      int64_t n, DType dtype, ReduceOp op,
                                                                      int root) {
  count(n, dtype);
  return inner_->reduce_async(send, recv, n, dtype, op, root);
}

std::shared_ptr<CommBackend> CountingCommunicator::split(int color, int key) {
  std::shared_ptr<Communicator> child = inner_->split(color, key);
  if (!child) return nullptr;  // a negative color: this rank joins no group
  return std::make_shared<CountingCommunicator>(std::move(child), counter_);
}

std::shared_ptr<CommBackend> CountingCommunicator::split_node() {
  std::shared_ptr<Communicator> node = inner_->split_node();
  if (!node) return nullptr;  // this backend cannot share host memory: say so as it does
  return std::make_shared<CountingCommunicator>(std::move(node), counter_);
}

}  // namespace shardopt_demo
