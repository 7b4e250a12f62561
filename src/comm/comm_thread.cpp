// src/comm/comm_thread.cpp — the FIFO communication thread and the communicator that forwards every call to it.
#include "comm/comm_thread.hpp"

#include "core/check.hpp"
#include "shardopt/comm_backend.hpp"

namespace shardopt {
namespace comm {

void Ticket::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Ticket::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Ticket> CommThread::run_here(const std::function<void()>& work) {
  auto ticket = std::make_shared<Ticket>();
  try {
    work();
  } catch (...) {
    ticket->error_ = std::current_exception();
  }
  ticket->done_ = true;
  return ticket;
}

std::shared_ptr<Ticket> CommThread::submit(std::function<void()> work) {
  if (on_this_thread()) return run_here(work);
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{std::move(work), ticket});
  }
  cv_.notify_all();
  return ticket;
}

void CommThread::drain() {
  try {
    run([] {});
  } catch (...) {
    // An empty item cannot fail.
  }
}

void CommThread::loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      item.work();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(item.ticket->mutex_);
      item.ticket->error_ = error;
      item.ticket->done_ = true;
    }
    item.ticket->cv_.notify_all();
  }
}

void require_serialized_calls(const Communicator& comm) { backend_of(comm)->require_serialized_calls(); }

namespace {

class TicketPending final : public PendingCollective {
 public:
  explicit TicketPending(std::shared_ptr<Ticket> ticket) : ticket_(std::move(ticket)) {}
  // A dropped handle still waits: the queued call may read or write the caller's buffers until
  // it ran (it ends by itself: a collective a peer never joins times out in the inner one).
  ~TicketPending() override {
    if (!ticket_) return;
    try {
      ticket_->wait();
    } catch (...) {
      // The caller chose not to wait; the inner communicator keeps any poisoning.
    }
  }
  void wait() override {
    std::shared_ptr<Ticket> ticket = std::move(ticket_);
    SHARDOPT_CHECK(ticket != nullptr, internal, "a pending collective was waited for twice");
    ticket->wait();
  }

 private:
  std::shared_ptr<Ticket> ticket_;
};

class SerialBackend final : public CommBackend {
 public:
  SerialBackend(std::shared_ptr<Communicator> inner, std::shared_ptr<CommThread> thread)
      : inner_(std::move(inner)), thread_(std::move(thread)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  bool cuda_aware() const override { return inner_->cuda_aware(); }
  void* cuda_stream() const override { return inner_->cuda_stream(); }
  // Its calls run on the communication thread: the inner transport must allow that.
  void require_serialized_calls() const override { comm::require_serialized_calls(*inner_); }
  double timeout_seconds() const override { return inner_->timeout_seconds(); }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    thread_->run([=] { inner_->broadcast(buffer, count, dtype, root); });
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    thread_->run([=] { inner_->all_gather(send, recv, count, dtype); });
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    thread_->run([=] { inner_->reduce_scatter(send, recv, count, dtype, op); });
  }
  void all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) override {
    thread_->run([=] { inner_->all_reduce(buffer, count, dtype, op); });
  }
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) override {
    thread_->run([=] { inner_->reduce(send, recv, count, dtype, op, root); });
  }
  void barrier() override {
    thread_->run([=] { inner_->barrier(); });
  }

  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype, int root) override {
    return queued([=] { inner_->broadcast(buffer, count, dtype, root); });
  }
  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override {
    return queued([=] { inner_->all_gather(send, recv, count, dtype); });
  }
  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override {
    return queued([=] { inner_->all_reduce(buffer, count, dtype, op); });
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype,
                                                          ReduceOp op) override {
    return queued([=] { inner_->reduce_scatter(send, recv, count, dtype, op); });
  }
  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count, DType dtype,
                                                  ReduceOp op, int root) override {
    return queued([=] { inner_->reduce(send, recv, count, dtype, op, root); });
  }

  // A rank that passes a negative color is in no group: null, as from the inner communicator
  // (node_topology.cpp asks so on the ranks that carry no data between uneven nodes).
  std::shared_ptr<CommBackend> split(int color, int key) override {
    std::shared_ptr<Communicator> child;
    thread_->run([&] { child = inner_->split(color, key); });
    return child ? std::make_shared<SerialBackend>(std::move(child), thread_) : nullptr;
  }
  std::shared_ptr<CommBackend> split_node() override {
    std::shared_ptr<Communicator> child;
    thread_->run([&] { child = inner_->split_node(); });
    return child ? std::make_shared<SerialBackend>(std::move(child), thread_) : nullptr;
  }

 private:
  std::unique_ptr<PendingCollective> queued(std::function<void()> work) {
    return std::make_unique<TicketPending>(thread_->submit(std::move(work)));
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<CommThread> thread_;
};

}  // namespace

std::shared_ptr<Communicator> serialize_on(std::shared_ptr<Communicator> inner, std::shared_ptr<CommThread> thread) {
  SHARDOPT_CHECK(inner != nullptr && thread != nullptr, internal, "serialize_on: null communicator or thread");
  return std::make_shared<Communicator>(std::make_shared<SerialBackend>(std::move(inner), std::move(thread)));
}

}  // namespace comm
}  // namespace shardopt
