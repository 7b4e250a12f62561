// src/remote/push_log.cpp — the pushes a context logged before they are summed, and the pool of their buffers.
#include "remote/push_log.hpp"

namespace shardopt {
namespace remote {

std::vector<char> MessagePool::take() {
  if (kept_.empty()) return {};
  std::vector<char> buffer = std::move(kept_.back());
  kept_.pop_back();
  bytes_ -= static_cast<int64_t>(buffer.capacity());
  return buffer;
}

void MessagePool::give(std::vector<char>&& buffer) {
  const int64_t size = static_cast<int64_t>(buffer.capacity());
  if (size == 0 || bytes_ + size > keep_bytes_) {
    buffer = {};  // past the bound: freed
    return;
  }
  bytes_ += size;
  kept_.push_back(std::move(buffer));
}

void PushLog::append(std::vector<char>&& message, MessagePool* pool) {
  pool_ = pool;
  bytes_ += static_cast<int64_t>(message.size());
  messages_.push_back(std::move(message));
}

void PushLog::pop_front() {
  bytes_ -= static_cast<int64_t>(messages_.front().size());
  if (pool_ != nullptr) pool_->give(std::move(messages_.front()));
  messages_.pop_front();
}

void PushLog::clear() {
  while (!messages_.empty()) pop_front();
}

}  // namespace remote
}  // namespace shardopt
