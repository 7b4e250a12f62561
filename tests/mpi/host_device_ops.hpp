// tests/mpi/host_device_ops.hpp — DeviceOps on host memory that counts every call, and a host communicator that reports a stream: the optimizer's device path, runnable and observable on the CPU.
//
// The "device" is host memory and every operation completes at once, so the results are the
// CPU kernels' (bitwise what the CUDA kernels produce); what the test looks at is what the
// optimizer asked of the device: allocations, host synchronisations, streams and events.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cpu/update_cpu.hpp"
#include "optim/device_ops.hpp"
#include "shardopt/comm_backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt_test {

struct DeviceCallCounts {
  int64_t allocations = 0;  // buffers, and the workspaces a kernel would allocate itself
  int64_t synchronizations = 0;
  int64_t streams_created = 0;
  int64_t events_created = 0;
  int64_t events_recorded = 0;
  int64_t event_waits = 0;
  int64_t copies = 0;
  int64_t launches = 0;
};

class HostDeviceOps final : public shardopt::optim::DeviceOps {
 public:
  explicit HostDeviceOps(DeviceCallCounts* counts) : counts_(counts) {}

  shardopt::core::FlatBuffer new_buffer(int64_t numel, shardopt::DType dtype, void*) override {
    if (numel > 0) ++counts_->allocations;
    shardopt::core::FlatBuffer buffer(shardopt::Device::cpu(), nullptr, dtype);
    buffer.resize(numel);
    return buffer;
  }
  void copy(void* dst, const void* src, std::size_t bytes, void*) override {
    ++counts_->copies;
    std::memmove(dst, src, bytes);
  }
  void zero(void* dst, std::size_t bytes, void*) override {
    ++counts_->copies;
    std::memset(dst, 0, bytes);
  }
  void synchronize(void*, const char*) override { ++counts_->synchronizations; }
  void* create_stream() override { return token(++counts_->streams_created); }
  void destroy_stream(void*) noexcept override {}
  void* create_event() override { return token(1000 + ++counts_->events_created); }
  void destroy_event(void*) noexcept override {}
  void record_event(void*, void*) override { ++counts_->events_recorded; }
  void stream_wait_event(void*, void*) override { ++counts_->event_waits; }

  void sgd_update(const shardopt::kernels::UpdateTensors& t, float* momentum_buf, int64_t n,
                  const shardopt::kernels::SgdScalars& s, const shardopt::kernels::GradTransform& gt,
                  const shardopt::kernels::Rounding& r, void*) override {
    ++counts_->launches;
    shardopt::kernels::sgd_update_cpu(t, momentum_buf, n, s, gt, r, 1);
  }
  void adam_update(const shardopt::kernels::UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                   float* max_exp_avg_sq, int64_t n, const shardopt::kernels::AdamScalars& s,
                   const shardopt::kernels::GradTransform& gt, const shardopt::kernels::Rounding& r,
                   void*) override {
    ++counts_->launches;
    shardopt::kernels::adam_update_cpu(t, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, gt, r, 1);
  }
  void adam_update_q8(const shardopt::kernels::UpdateTensors& t, const shardopt::kernels::Q8Moments& q, int64_t n,
                      const shardopt::kernels::AdamScalars& s, const shardopt::kernels::GradTransform& gt,
                      const shardopt::kernels::Rounding& r, void*) override {
    ++counts_->launches;
    shardopt::kernels::adam_update_q8_cpu(t, q, n, s, gt, r, 1);
  }
  void muon_update(const shardopt::kernels::UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols,
                   const shardopt::kernels::MuonScalars& s, const shardopt::kernels::GradTransform& gt,
                   const shardopt::kernels::Rounding& r, shardopt::kernels::MuonPrecision precision, void*) override {
    ++counts_->launches;
    shardopt::kernels::muon_update_cpu(t, momentum_buf, rows, cols, s, gt, r, precision, 1, muon_workspace_);
  }
  void grad_stats(const void* grad, shardopt::DType dtype, int64_t n, float unscale, bool inf_norm, double* out,
                  bool accumulate, void* workspace, void*) override {
    ++counts_->launches;
    if (workspace == nullptr) ++counts_->allocations;  // CUDA would allocate one for this call
    const shardopt::kernels::GradStats part = shardopt::kernels::grad_stats_cpu(grad, dtype, n, unscale, inf_norm, 1);
    if (accumulate) {
      out[0] = inf_norm ? std::max(out[0], part.value) : out[0] + part.value;
      out[1] = out[1] != 0.0 || part.nonfinite ? 1.0 : 0.0;
    } else {
      out[0] = part.value;
      out[1] = part.nonfinite ? 1.0 : 0.0;
    }
  }
  std::size_t grad_stats_workspace_bytes() const override { return 256; }
  void divide(void* x, shardopt::DType dtype, int64_t n, float divisor, void*) override {
    ++counts_->launches;
    shardopt::kernels::divide_cpu(x, dtype, n, divisor, 1);
  }
  void widen(const void* src, shardopt::DType dtype, float* dst, int64_t n, void*) override {
    ++counts_->launches;
    shardopt::kernels::widen_cpu(src, dtype, dst, n, 1);
  }
  void narrow(const float* src, void* dst, shardopt::DType dtype, int64_t n, void*) override {
    ++counts_->launches;
    shardopt::kernels::narrow_cpu(src, dst, dtype, n, 1);
  }

 private:
  static void* token(int64_t n) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(n) * 64); }
  DeviceCallCounts* counts_;
  shardopt::kernels::MuonWorkspace muon_workspace_;
};

// The host communicator `inner`, reporting a stream: to DeviceContext it is stream-ordered as
// NCCL is (its collectives complete at once, which any stream order allows).
class StreamReportingComm final : public shardopt::CommBackend {
 public:
  explicit StreamReportingComm(std::shared_ptr<shardopt::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  shardopt::Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return "stream-reporting host"; }
  bool cuda_aware() const override { return true; }
  void* cuda_stream() const override { return const_cast<int*>(&stream_token_); }
  void broadcast(void* b, int64_t n, shardopt::DType d, int root) override { inner_->broadcast(b, n, d, root); }
  void all_gather(const void* s, void* r, int64_t n, shardopt::DType d) override { inner_->all_gather(s, r, n, d); }
  void reduce_scatter(const void* s, void* r, int64_t n, shardopt::DType d, shardopt::ReduceOp op) override {
    inner_->reduce_scatter(s, r, n, d, op);
  }
  void all_reduce(void* b, int64_t n, shardopt::DType d, shardopt::ReduceOp op) override {
    inner_->all_reduce(b, n, d, op);
  }
  void reduce(const void* s, void* r, int64_t n, shardopt::DType d, shardopt::ReduceOp op, int root) override {
    inner_->reduce(s, r, n, d, op, root);
  }
  void barrier() override { inner_->barrier(); }
  // Finished before returning, so that dropping the handle (as the stream-ordered path does)
  // leaves nothing behind.
  std::unique_ptr<shardopt::PendingCollective> broadcast_async(void* b, int64_t n, shardopt::DType d,
                                                               int root) override {
    return done(inner_->broadcast_async(b, n, d, root));
  }
  std::unique_ptr<shardopt::PendingCollective> all_gather_async(const void* s, void* r, int64_t n,
                                                                shardopt::DType d) override {
    return done(inner_->all_gather_async(s, r, n, d));
  }
  std::unique_ptr<shardopt::PendingCollective> all_reduce_async(void* b, int64_t n, shardopt::DType d,
                                                                shardopt::ReduceOp op) override {
    return done(inner_->all_reduce_async(b, n, d, op));
  }
  std::unique_ptr<shardopt::PendingCollective> reduce_scatter_async(const void* s, void* r, int64_t n,
                                                                    shardopt::DType d,
                                                                    shardopt::ReduceOp op) override {
    return done(inner_->reduce_scatter_async(s, r, n, d, op));
  }
  std::unique_ptr<shardopt::PendingCollective> reduce_async(const void* s, void* r, int64_t n, shardopt::DType d,
                                                            shardopt::ReduceOp op, int root) override {
    return done(inner_->reduce_async(s, r, n, d, op, root));
  }
  std::unique_ptr<shardopt::PendingCollective> broadcast_group_async(const shardopt::BroadcastPart* parts,
                                                                     std::size_t count, shardopt::DType d) override {
    ++groups_;
    return done(inner_->broadcast_group_async(parts, count, d));
  }
  std::shared_ptr<shardopt::CommBackend> split(int color, int key) override {
    std::shared_ptr<shardopt::Communicator> child = inner_->split(color, key);
    return child ? shardopt::backend_of(*child) : nullptr;
  }
  int64_t groups() const { return groups_; }
  int64_t host_waits() const { return host_waits_; }

 private:
  // What the optimizer gets back: a wait on it is a host wait for a collective, which on NCCL
  // would poll the collective's event from the host.
  struct Finished final : shardopt::PendingCollective {
    explicit Finished(int64_t* waits) : waits_(waits) {}
    void wait() override { ++*waits_; }
    int64_t* waits_;
  };
  std::unique_ptr<shardopt::PendingCollective> done(std::unique_ptr<shardopt::PendingCollective> p) {
    p->wait();
    return std::make_unique<Finished>(&host_waits_);
  }
  std::shared_ptr<shardopt::Communicator> inner_;
  int stream_token_ = 0;
  int64_t groups_ = 0;
  int64_t host_waits_ = 0;
};

}  // namespace shardopt_test
