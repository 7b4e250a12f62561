// src/remote/push_log.hpp — a context's pushes kept as received (whole request messages) until the owner sums them, and the bounded pool their buffers return to.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace shardopt {
namespace remote {

// Message buffers of summed or dropped pushes, kept for the next receives: a push then lands in
// memory already faulted in. Keeps buffers while it holds at most `keep_bytes` (their capacity).
class MessagePool {
 public:
  explicit MessagePool(int64_t keep_bytes) : keep_bytes_(keep_bytes) {}
  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;
  std::vector<char> take();  // a kept buffer (its old size and contents), or an empty one
  void give(std::vector<char>&& buffer);
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<std::vector<char>> kept_;
  int64_t bytes_ = 0;
  int64_t keep_bytes_;
};

// The pushes of one context not yet summed, in arrival order (the order they are summed in).
// Dropping it (the context applied, refused or expired) gives its buffers to the pool.
class PushLog {
 public:
  PushLog() = default;
  PushLog(const PushLog&) = delete;
  PushLog& operator=(const PushLog&) = delete;
  ~PushLog() { clear(); }
  void append(std::vector<char>&& message, MessagePool* pool);
  bool empty() const { return messages_.empty(); }
  int64_t bytes() const { return bytes_; }  // the messages' sizes
  const std::vector<char>& front() const { return messages_.front(); }
  void pop_front();  // the front message, summed: its buffer to the pool
  void clear();

 private:
  std::deque<std::vector<char>> messages_;
  int64_t bytes_ = 0;
  MessagePool* pool_ = nullptr;
};

}  // namespace remote
}  // namespace shardopt
