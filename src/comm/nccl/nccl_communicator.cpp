// src/comm/nccl/nccl_communicator.cpp — the NCCL transport (CommBackend) on device buffers: argument checks, enqueueing on the stream, split.
#include "comm/nccl/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "shardopt/nccl.hpp"

namespace shardopt {
namespace comm {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::byte: return ncclUint8;  // moved, never reduced (nccl_reduction refuses it)
  }
  raise(ErrorCode::invalid_argument, "nccl: unknown dtype {}", static_cast<int>(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  raise(ErrorCode::invalid_argument, "nccl: unknown reduce op {}", static_cast<int>(op));
}

// The NCCL operation for reducing `dtype` with `op` in collective `name` over `ranks` ranks;
// byte has no arithmetic. Over one rank avg and sum both give each value itself, bit for bit,
// and one rank sums: NCCL 2.28.9's one-rank avg (a pre-multiplied sum) left the last 3 elements
// of out-of-place buffers of 2^18 + 3 elements and more unwritten on an H100, where sum copies.
ncclRedOp_t nccl_reduction(DType dtype, ReduceOp op, int ranks, const char* name) {
  SHARDOPT_CHECK(dtype != DType::byte, unsupported,
                 "{} over nccl cannot reduce dtype byte: byte is raw bytes that collectives move "
                 "(broadcast, all_gather) without arithmetic; reductions take f32, bf16 and f16",
                 name);
  if (ranks == 1 && op == ReduceOp::avg) return ncclSum;
  return nccl_op(op);
}

class NcclBackend final : public CommBackend {
 public:
  explicit NcclBackend(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  Device device() const override { return Device::cuda(state_->device); }
  const char* backend_name() const override { return "nccl"; }
  bool cuda_aware() const override { return true; }
  void* cuda_stream() const override { return state_->cuda_stream(); }

  // The blocking collectives are CommBackend's: start the nonblocking form, then wait.
  void barrier() override {
    NcclState& s = *state_;
    issue("barrier", 1, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(s.barrier_word, s.barrier_word, 1, ncclInt32, ncclSum, comm, stream);
    })->wait();
  }

  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype,
                                                     int root) override {
    const char* name = "broadcast";
    check_count(count, name);
    SHARDOPT_CHECK(root >= 0 && root < state_->size, invalid_argument,
                   "broadcast: root {} is not a rank of this {}-rank communicator", root,
                   state_->size);
    if (count > 0) check_device_buffer(buffer, name, "buffer");
    const ncclDataType_t type = nccl_type(dtype);
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(buffer, buffer, static_cast<size_t>(count), type, root, comm, stream);
    });
  }

  // One group: NCCL launches the broadcasts together once ncclGroupEnd is called, so nothing
  // is on the stream before that and the completion event is recorded after it.
  std::unique_ptr<PendingCollective> broadcast_group_async(const BroadcastPart* parts, std::size_t count,
                                                           DType dtype) override {
    const char* name = "broadcast";
    NcclState& s = *state_;
    const ncclDataType_t type = nccl_type(dtype);
    bool any = false;
    for (std::size_t i = 0; i < count; ++i) {
      const BroadcastPart& part = parts[i];
      check_count(part.count, name);
      SHARDOPT_CHECK(part.root >= 0 && part.root < s.size, invalid_argument,
                     "broadcast: root {} is not a rank of this {}-rank communicator", part.root, s.size);
      if (part.count > 0) check_device_buffer(part.buffer, name, "buffer");
      any = any || part.count > 0;
    }
    s.check_usable(name);
    // Every rank passes the same counts, so every rank skips together.
    if (!any) return std::make_unique<NcclPending>(state_, name, nullptr);
    const DeviceGuard guard(s.device, s.rank);
    ncclResult_t failed = ncclGroupStart();
    if (failed != ncclSuccess) s.settle(failed, name);
    for (std::size_t i = 0; i < count && failed == ncclSuccess; ++i) {
      const BroadcastPart& part = parts[i];
      if (part.count == 0) continue;
      const ncclResult_t result = ncclBroadcast(part.buffer, part.buffer, static_cast<size_t>(part.count), type,
                                                part.root, s.comm, s.cuda_stream());
      if (result != ncclSuccess && result != ncclInProgress) failed = result;
    }
    const ncclResult_t ended = ncclGroupEnd();  // closes the group even after a failed call
    s.settle(failed != ncclSuccess ? failed : ended, name);
    return record_completion(name);
  }

  // NCCL itself handles the in-place form (send == recv + rank*count).
  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override {
    const char* name = "all_gather";
    check_count(count, name);
    if (count > 0) {
      check_device_buffer(send, name, "send");
      check_device_buffer(recv, name, "recv");
    }
    const ncclDataType_t type = nccl_type(dtype);
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(send, recv, static_cast<size_t>(count), type, comm, stream);
    });
  }

  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override {
    const char* name = "all_reduce";
    check_count(count, name);
    if (count > 0) check_device_buffer(buffer, name, "buffer");
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t reduction = nccl_reduction(dtype, op, state_->size, name);
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(buffer, buffer, static_cast<size_t>(count), type, reduction, comm,
                           stream);
    });
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                          int64_t count, DType dtype,
                                                          ReduceOp op) override {
    const char* name = "reduce_scatter";
    check_count(count, name);
    if (count > 0) {
      check_device_buffer(send, name, "send");
      check_device_buffer(recv, name, "recv");
    }
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t reduction = nccl_reduction(dtype, op, state_->size, name);
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(send, recv, static_cast<size_t>(count), type, reduction, comm,
                               stream);
    });
  }

  // NCCL itself handles the in-place form (send == recv on the root); recv is only looked at
  // on the root.
  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                  DType dtype, ReduceOp op, int root) override {
    const char* name = "reduce";
    check_count(count, name);
    SHARDOPT_CHECK(root >= 0 && root < state_->size, invalid_argument,
                   "reduce: root {} is not a rank of this {}-rank communicator", root,
                   state_->size);
    const bool is_root = state_->rank == root;
    if (count > 0) {
      check_device_buffer(send, name, "send");
      if (is_root) check_device_buffer(recv, name, "recv");
    }
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t reduction = nccl_reduction(dtype, op, state_->size, name);
    void* target = is_root ? recv : nullptr;
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduce(send, target, static_cast<size_t>(count), type, reduction, root, comm,
                        stream);
    });
  }

  std::shared_ptr<CommBackend> split(int color, int key) override;

 private:
  void check_count(int64_t count, const char* op) const {
    SHARDOPT_CHECK(count >= 0, invalid_argument, "{}: negative count {}", op, count);
    state_->check_usable(op);
  }

  // A clear error here beats an illegal-address fault inside a NCCL kernel later.
  void check_device_buffer(const void* p, const char* op, const char* name) const {
    const NcclState& s = *state_;
    SHARDOPT_CHECK(p != nullptr, invalid_argument, "{} on rank {}: `{}` is null", op, s.rank, name);
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it: it says nothing about the device's health
      raise(ErrorCode::invalid_argument, "{} on rank {}: cannot tell where `{}` lives: {}", op,
            s.rank, name, cudaGetErrorString(status));
    }
    const bool usable = attributes.type == cudaMemoryTypeManaged ||
                        (attributes.type == cudaMemoryTypeDevice && attributes.device == s.device);
    SHARDOPT_CHECK(usable, invalid_argument,
                   "{} on rank {}: `{}` is {}; the nccl backend needs device memory of cuda:{}",
                   op, s.rank, name, device::memory_kind(attributes), s.device);
  }

  // Enqueues one NCCL call on our stream and returns its completion as a PendingCollective.
  template <typename Call>
  std::unique_ptr<PendingCollective> issue(const char* op, int64_t count, const Call& call) {
    NcclState& s = *state_;
    s.check_usable(op);
    // Every rank passes the same count, so every rank skips together.
    if (count == 0) return std::make_unique<NcclPending>(state_, op, nullptr);
    const DeviceGuard guard(s.device, s.rank);
    s.settle(call(s.comm, s.cuda_stream()), op);
    return record_completion(op);
  }

  // The completion of what was just enqueued on our stream, on an event from the pool.
  std::unique_ptr<PendingCollective> record_completion(const char* op) {
    NcclState& s = *state_;
    auto pending = std::make_unique<NcclPending>(state_, op, s.acquire_event());
    check_cuda(cudaEventRecord(pending->event(), s.cuda_stream()), "cudaEventRecord", s.rank);
    return pending;
  }

  std::shared_ptr<NcclState> state_;
};

}  // namespace

void finish_nccl_state(NcclState& s) {
  ncclCommUserRank(s.comm, &s.rank);
  ncclCommCount(s.comm, &s.size);
  const DeviceGuard guard(s.device, s.rank);
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&s.barrier_word), sizeof(int32_t)),
             "cudaMalloc(barrier scratch)", s.rank);
  check_cuda(cudaMemset(s.barrier_word, 0, sizeof(int32_t)), "cudaMemset(barrier scratch)", s.rank);
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

std::shared_ptr<CommBackend> NcclBackend::split(int color, int key) {
  NcclState& s = *state_;
  s.check_usable("split");
  const DeviceGuard guard(s.device, s.rank);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  const ncclResult_t result =
      ncclCommSplit(s.comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    raise(ErrorCode::comm, "split(color {}, key {}) on rank {} of {} (nccl) failed: {}", color, key,
          s.rank, s.size, nccl_error_text(result, s.comm));
  }
  // Both the parent and the child report ncclInProgress until the split is done.
  const Deadline deadline(s.options.timeout_seconds);
  ncclResult_t parent_state = ncclInProgress;
  ncclResult_t child_state = ncclSuccess;
  const bool settled = poll_until(deadline, [&] {
    ncclCommGetAsyncError(s.comm, &parent_state);
    if (child != nullptr) ncclCommGetAsyncError(child, &child_state);
    return parent_state != ncclInProgress && child_state != ncclInProgress;
  });
  if (!settled || parent_state != ncclSuccess || child_state != ncclSuccess) {
    if (child != nullptr) ncclCommAbort(child);
    const ncclResult_t failed = parent_state != ncclSuccess ? parent_state : child_state;
    s.abort_and_raise(
        settled ? ErrorCode::comm : ErrorCode::timeout,
        settled ? fmt::format("split(color {}, key {}) on rank {} of {} (nccl) failed: {}", color,
                              key, s.rank, s.size, nccl_error_text(failed, s.comm))
                : fmt::format("split(color {}, key {}) on rank {} of {} (nccl) did not complete "
                              "within {:g} s; the NCCL communicator was aborted",
                              color, key, s.rank, s.size, deadline.seconds()));
  }
  if (child == nullptr) return nullptr;  // color < 0: this rank joins no group
  auto state = std::make_shared<NcclState>();
  state->comm = child;
  state->device = s.device;
  state->stream = s.stream;  // one stream per device keeps all our collectives in one order
  state->options = s.options;
  state->mpi_keepalive = s.mpi_keepalive;
  finish_nccl_state(*state);
  return std::make_shared<NcclBackend>(std::move(state));
}

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<NcclState> state) {
  return std::make_shared<Communicator>(std::make_shared<NcclBackend>(std::move(state)));
}

}  // namespace comm

void* nccl_stream(const Communicator& comm) {
  const auto* nccl = dynamic_cast<const comm::NcclBackend*>(backend_of(comm).get());
  SHARDOPT_CHECK(nccl != nullptr, invalid_argument,
                 "nccl_stream: the communicator is a '{}' communicator, not nccl",
                 comm.backend_name());
  return nccl->cuda_stream();
}

}  // namespace shardopt
