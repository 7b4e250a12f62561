// tests/mpi/lazy_stream_comm.hpp — a host communicator whose "communication stream" runs late: collectives wait in a queue until the compute stream waits for an event recorded behind them (or the host waits), so a read the optimizer forgot to order after a collective sees the values from before it.
//
// With HostDeviceOps every operation completes at once, which hides a missing stream wait. Here
// the compute stream still runs at once, but the collectives queued on the communication stream
// run only when something waits for them: stream_wait_event(compute, e) for an event recorded on
// the communication stream runs the queue up to that record; a pending collective's wait() and
// any blocking call run it all first (so every rank still issues its collectives in program
// order, and MPI matches them). The result then equals the plain step only if every read of a
// collective's result is ordered after it, as it must be on a GPU.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>

#include "host_device_ops.hpp"

namespace shardopt_test {

// The communication stream: queued collectives, run in order when waited for.
class LazyStream {
 public:
  void push(std::function<void()> work) {
    queue_.push_back(std::move(work));
    ++enqueued_;
  }
  // Runs everything queued before position `position` (enqueued count).
  void run_until(int64_t position) {
    while (executed_ < position && !queue_.empty()) {
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      ++executed_;
      work();
    }
  }
  void run_all() { run_until(enqueued_); }
  int64_t enqueued() const { return enqueued_; }
  int64_t deferred_runs() const { return deferred_runs_; }
  void count_deferred_run() { ++deferred_runs_; }
  void* token() { return &token_; }

 private:
  std::deque<std::function<void()>> queue_;
  int64_t enqueued_ = 0;
  int64_t executed_ = 0;
  int64_t deferred_runs_ = 0;
  int token_ = 0;
};

// HostDeviceOps whose events recorded on the communication stream mark a queue position, and
// whose compute stream runs the queue up to it when it waits for such an event.
class LazyDeviceOps final : public shardopt::optim::DeviceOps {
 public:
  LazyDeviceOps(DeviceCallCounts* counts, std::shared_ptr<LazyStream> stream)
      : host_(counts), stream_(std::move(stream)) {}

  shardopt::core::FlatBuffer new_buffer(int64_t numel, shardopt::DType dtype, void* s) override {
    return host_.new_buffer(numel, dtype, s);
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* s) override { host_.copy(dst, src, bytes, s); }
  void zero(void* dst, std::size_t bytes, void* s) override { host_.zero(dst, bytes, s); }
  // The compute stream's own work is done already; what it waited for ran when it waited.
  void synchronize(void* s, const char* why) override { host_.synchronize(s, why); }
  void* create_stream() override { return host_.create_stream(); }
  void destroy_stream(void* s) noexcept override { host_.destroy_stream(s); }
  void* create_event() override { return host_.create_event(); }
  void destroy_event(void* e) noexcept override { host_.destroy_event(e); }
  void record_event(void* e, void* s) override {
    host_.record_event(e, s);
    if (s == stream_->token()) {
      positions_[e] = stream_->enqueued();
    } else {
      positions_.erase(e);  // recorded on the compute stream: complete at once
    }
  }
  void stream_wait_event(void* s, void* e) override {
    host_.stream_wait_event(s, e);
    if (s == stream_->token()) return;  // the communication stream waits for done compute work
    const auto it = positions_.find(e);
    if (it == positions_.end()) return;
    stream_->count_deferred_run();
    stream_->run_until(it->second);
  }
  void sgd_update(const shardopt::kernels::UpdateTensors& t, float* m, int64_t n, const shardopt::kernels::SgdScalars& sc,
                  const shardopt::kernels::GradTransform& gt, const shardopt::kernels::Rounding& r, void* s) override {
    host_.sgd_update(t, m, n, sc, gt, r, s);
  }
  void adam_update(const shardopt::kernels::UpdateTensors& t, float* a, float* b, float* c, int64_t n,
                   const shardopt::kernels::AdamScalars& sc, const shardopt::kernels::GradTransform& gt,
                   const shardopt::kernels::Rounding& r, void* s) override {
    host_.adam_update(t, a, b, c, n, sc, gt, r, s);
  }
  void grad_stats(const void* g, shardopt::DType d, int64_t n, float u, bool inf, double* out, bool acc, void* w,
                  void* s) override {
    host_.grad_stats(g, d, n, u, inf, out, acc, w, s);
  }
  std::size_t grad_stats_workspace_bytes() const override { return host_.grad_stats_workspace_bytes(); }
  void divide(void* x, shardopt::DType d, int64_t n, float divisor, void* s) override { host_.divide(x, d, n, divisor, s); }
  void widen(const void* src, shardopt::DType d, float* dst, int64_t n, void* s) override { host_.widen(src, d, dst, n, s); }
  void narrow(const float* src, void* dst, shardopt::DType d, int64_t n, void* s) override {
    host_.narrow(src, dst, d, n, s);
  }

 private:
  HostDeviceOps host_;
  std::shared_ptr<LazyStream> stream_;
  std::map<void*, int64_t> positions_;  // event -> queue position of its last record
};

// The host communicator `inner` on a LazyStream: the async forms queue the blocking call; the
// blocking forms run the queue first, then the call.
class LazyStreamComm final : public shardopt::CommBackend {
 public:
  LazyStreamComm(std::shared_ptr<shardopt::Communicator> inner, std::shared_ptr<LazyStream> stream)
      : inner_(std::move(inner)), stream_(std::move(stream)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  shardopt::Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return "lazy-stream host"; }
  bool cuda_aware() const override { return true; }
  void* cuda_stream() const override { return stream_->token(); }

  void broadcast(void* b, int64_t n, shardopt::DType d, int root) override {
    stream_->run_all();
    inner_->broadcast(b, n, d, root);
  }
  void all_gather(const void* s, void* r, int64_t n, shardopt::DType d) override {
    stream_->run_all();
    inner_->all_gather(s, r, n, d);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, shardopt::DType d, shardopt::ReduceOp op) override {
    stream_->run_all();
    inner_->reduce_scatter(s, r, n, d, op);
  }
  void all_reduce(void* b, int64_t n, shardopt::DType d, shardopt::ReduceOp op) override {
    stream_->run_all();
    inner_->all_reduce(b, n, d, op);
  }
  void reduce(const void* s, void* r, int64_t n, shardopt::DType d, shardopt::ReduceOp op, int root) override {
    stream_->run_all();
    inner_->reduce(s, r, n, d, op, root);
  }
  void barrier() override {
    stream_->run_all();
    inner_->barrier();
  }
  std::unique_ptr<shardopt::PendingCollective> broadcast_async(void* b, int64_t n, shardopt::DType d,
                                                               int root) override {
    return queue([=] { inner_->broadcast(b, n, d, root); });
  }
  std::unique_ptr<shardopt::PendingCollective> broadcast_group_async(const shardopt::BroadcastPart* parts,
                                                                     std::size_t count, shardopt::DType d) override {
    ++groups_;
    std::vector<shardopt::BroadcastPart> copy(parts, parts + count);
    return queue([this, copy, d] {
      for (const shardopt::BroadcastPart& p : copy) inner_->broadcast(p.buffer, p.count, d, p.root);
    });
  }
  std::unique_ptr<shardopt::PendingCollective> all_gather_async(const void* s, void* r, int64_t n,
                                                                shardopt::DType d) override {
    return queue([=] { inner_->all_gather(s, r, n, d); });
  }
  std::unique_ptr<shardopt::PendingCollective> all_reduce_async(void* b, int64_t n, shardopt::DType d,
                                                                shardopt::ReduceOp op) override {
    return queue([=] { inner_->all_reduce(b, n, d, op); });
  }
  std::unique_ptr<shardopt::PendingCollective> reduce_scatter_async(const void* s, void* r, int64_t n,
                                                                    shardopt::DType d,
                                                                    shardopt::ReduceOp op) override {
    return queue([=] { inner_->reduce_scatter(s, r, n, d, op); });
  }
  std::unique_ptr<shardopt::PendingCollective> reduce_async(const void* s, void* r, int64_t n, shardopt::DType d,
                                                            shardopt::ReduceOp op, int root) override {
    return queue([=] { inner_->reduce(s, r, n, d, op, root); });
  }
  std::shared_ptr<shardopt::CommBackend> split(int color, int key) override {
    stream_->run_all();
    std::shared_ptr<shardopt::Communicator> child = inner_->split(color, key);
    return child ? shardopt::backend_of(*child) : nullptr;
  }
  int64_t groups() const { return groups_; }
  int64_t host_waits() const { return host_waits_; }

 private:
  // A host wait for a queued collective runs the queue up to it (NCCL: polling its event).
  struct Queued final : shardopt::PendingCollective {
    Queued(LazyStream* stream, int64_t position, int64_t* waits) : stream_(stream), position_(position), waits_(waits) {}
    void wait() override {
      ++*waits_;
      stream_->run_until(position_);
    }
    LazyStream* stream_;
    int64_t position_;
    int64_t* waits_;
  };
  std::unique_ptr<shardopt::PendingCollective> queue(std::function<void()> work) {
    stream_->push(std::move(work));
    return std::make_unique<Queued>(stream_.get(), stream_->enqueued(), &host_waits_);
  }
  std::shared_ptr<shardopt::Communicator> inner_;
  std::shared_ptr<LazyStream> stream_;
  int64_t groups_ = 0;
  int64_t host_waits_ = 0;
};

}  // namespace shardopt_test
