// src/comm/nccl/nccl_communicator.cpp — the Communicator over NCCL on device buffers, bootstrapped over MPI, with a watchdog.
//
// NCCL communicators are created non-blocking (ncclConfig_t::blocking = 0): NCCL calls then
// return ncclInProgress instead of blocking inside the library, so every wait (for init, for
// a split, for a collective to be enqueued, and for it to complete: a CUDA event recorded
// after it) is a polling loop with a deadline. When the deadline passes, or NCCL reports an
// asynchronous error, the communicator is aborted (ncclCommAbort frees it and stops its
// kernels) and an Error names the operation and rank, instead of a hang.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/check.hpp"
#include "shardopt/nccl.hpp"

namespace shardopt {
namespace {

using Clock = std::chrono::steady_clock;

// After `seconds` (never, when <= 0) a wait becomes an error.
class Deadline {
 public:
  explicit Deadline(double seconds) : seconds_(seconds), start_(Clock::now()) {}
  bool expired() const {
    return seconds_ > 0 &&
           std::chrono::duration<double>(Clock::now() - start_).count() > seconds_;
  }
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  Clock::time_point start_;
};

// Calls `done()` until it returns true (-> true) or the deadline passes (-> false). Spins with
// yields first (collectives are usually short), then backs off so that a long wait, or ranks
// oversubscribing the cores, do not burn a core each.
template <typename Done>
bool poll_until(const Deadline& deadline, const Done& done) {
  for (uint64_t spin = 0;; ++spin) {
    if (done()) return true;
    if (spin < 4096) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if ((spin & 63) == 63 && deadline.expired()) return false;
  }
}

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') text += fmt::format(" ({})", detail);
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
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

void check_cuda(cudaError_t status, const char* what, int rank) {
  if (status != cudaSuccess) {
    raise(ErrorCode::cuda, "{} failed on rank {}: {} ({})", what, rank, cudaGetErrorString(status),
          cudaGetErrorName(status));
  }
}

// Makes `device` current for a scope: the caller's thread may be working on another device.
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// The stream collectives run on; destroyed with the last communicator using it when we made it.
struct StreamHolder {
  cudaStream_t stream = nullptr;
  bool owned = false;
  ~StreamHolder() {
    if (owned && stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Everything a communicator and its pending collectives share. Pending collectives hold it by
// shared_ptr, so one that outlives its communicator can still be waited on safely.
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::shared_ptr<StreamHolder> stream;
  CommOptions options;
  std::string abort_reason;        // set once the communicator has been aborted
  int32_t* barrier_word = nullptr;  // device scratch for barrier()'s one-element all-reduce
  std::shared_ptr<Communicator> mpi_keepalive;  // keeps MPI initialised while we live (world form)

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  ~NcclState() {
    if (barrier_word != nullptr) cudaFree(barrier_word);
    if (comm == nullptr) return;
    // Finalize flushes our outstanding work and waits for the peers to be quiescent; if they
    // never are (a peer died), abort instead of hanging in a destructor.
    ncclResult_t state = ncclCommFinalize(comm);
    if (state == ncclInProgress) {
      const Deadline deadline(options.timeout_seconds);
      poll_until(deadline, [&] {
        ncclCommGetAsyncError(comm, &state);
        return state != ncclInProgress;
      });
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  }

  cudaStream_t cuda_stream() const { return stream->stream; }

  void check_usable(const char* op) const {
    SHARDOPT_CHECK(abort_reason.empty(), comm,
                   "{}: the nccl communicator of rank {} of {} was aborted after an earlier "
                   "failure ({}); create a new one",
                   op, rank, size, abort_reason);
  }

  [[noreturn]] void abort_and_raise(ErrorCode code, const std::string& message) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    if (abort_reason.empty()) abort_reason = message;
    throw Error(code, message);
  }

  // A non-blocking communicator may answer ncclInProgress while NCCL finishes taking the call.
  void settle(ncclResult_t result, const char* op) {
    if (result == ncclSuccess) return;
    if (result != ncclInProgress) {
      raise(ErrorCode::comm, "{} on rank {} of {} (nccl, cuda:{}) failed: {}", op, rank, size,
            device, nccl_error_text(result, comm));
    }
    const Deadline deadline(options.timeout_seconds);
    ncclResult_t state = ncclInProgress;
    const bool settled = poll_until(deadline, [&] {
      ncclCommGetAsyncError(comm, &state);
      return state != ncclInProgress;
    });
    if (!settled) {
      abort_and_raise(ErrorCode::timeout,
                      fmt::format("{} on rank {} of {} (nccl, cuda:{}) did not complete within "
                                  "{:g} s (NCCL kept reporting ncclInProgress: a peer is missing "
                                  "or stuck); the NCCL communicator was aborted",
                                  op, rank, size, device, deadline.seconds()));
    }
    if (state != ncclSuccess) {
      abort_and_raise(ErrorCode::comm,
                      fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed: {}", op, rank,
                                  size, device, nccl_error_text(state, comm)));
    }
  }
};

class NcclPending final : public PendingCollective {
 public:
  // A null event means there was nothing to do (zero elements).
  NcclPending(std::shared_ptr<NcclState> state, const char* op, cudaEvent_t event)
      : state_(std::move(state)), op_(op), event_(event) {}
  ~NcclPending() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;

  void wait() override {
    if (event_ == nullptr) return;
    NcclState& s = *state_;
    s.check_usable(op_);
    const Deadline deadline(s.options.timeout_seconds);
    cudaError_t cuda_status = cudaErrorNotReady;
    ncclResult_t nccl_status = ncclSuccess;
    const bool finished = poll_until(deadline, [&] {
      cuda_status = cudaEventQuery(event_);
      if (cuda_status != cudaErrorNotReady) return true;
      // A peer that failed or vanished shows up here long before any deadline.
      ncclCommGetAsyncError(s.comm, &nccl_status);
      return nccl_status != ncclSuccess && nccl_status != ncclInProgress;
    });
    if (!finished) {
      s.abort_and_raise(ErrorCode::timeout,
                        fmt::format("{} on rank {} of {} (nccl, cuda:{}) did not complete within "
                                    "{:g} s: a peer is dead, stuck, or issued a different "
                                    "collective; the NCCL communicator was aborted",
                                    op_, s.rank, s.size, s.device, deadline.seconds()));
    }
    if (cuda_status == cudaErrorNotReady) {
      s.abort_and_raise(ErrorCode::comm,
                        fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed: {}; the NCCL "
                                    "communicator was aborted",
                                    op_, s.rank, s.size, s.device,
                                    nccl_error_text(nccl_status, s.comm)));
    }
    if (cuda_status != cudaSuccess) {
      s.abort_and_raise(ErrorCode::cuda,
                        fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed on the device: {} "
                                    "({}); the NCCL communicator was aborted",
                                    op_, s.rank, s.size, s.device, cudaGetErrorString(cuda_status),
                                    cudaGetErrorName(cuda_status)));
    }
    cudaEventDestroy(event_);
    event_ = nullptr;
  }

 private:
  std::shared_ptr<NcclState> state_;
  const char* op_;
  cudaEvent_t event_;
};

std::string memory_kind(const cudaPointerAttributes& attributes) {
  switch (attributes.type) {
    case cudaMemoryTypeUnregistered: return "host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return fmt::format("device memory of cuda:{}", attributes.device);
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of unknown kind";
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  Device device() const override { return Device::cuda(state_->device); }
  const char* backend_name() const override { return "nccl"; }
  void* stream() const { return state_->cuda_stream(); }

  void broadcast(void* buffer, int64_t count, DType dtype, int root) override {
    broadcast_async(buffer, count, dtype, root)->wait();
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    all_gather_async(send, recv, count, dtype)->wait();
  }
  void all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op) override {
    all_reduce_async(buffer, count, dtype, op)->wait();
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                      ReduceOp op) override {
    reduce_scatter_async(send, recv, count, dtype, op)->wait();
  }
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
              int root) override {
    reduce_async(send, recv, count, dtype, op, root)->wait();
  }

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
    const ncclRedOp_t reduction = nccl_op(op);
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
    const ncclRedOp_t reduction = nccl_op(op);
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
    const ncclRedOp_t reduction = nccl_op(op);
    void* target = is_root ? recv : nullptr;
    return issue(name, count, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduce(send, target, static_cast<size_t>(count), type, reduction, root, comm,
                        stream);
    });
  }

  std::shared_ptr<Communicator> split(int color, int key) override;

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
                   op, s.rank, name, memory_kind(attributes), s.device);
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
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", s.rank);
    auto pending = std::make_unique<NcclPending>(state_, op, event);
    check_cuda(cudaEventRecord(event, s.cuda_stream()), "cudaEventRecord", s.rank);
    return pending;
  }

  std::shared_ptr<NcclState> state_;
};

// Fills in rank/size and the barrier scratch of a freshly initialised communicator.
void finish_state(NcclState& s) {
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

std::shared_ptr<Communicator> NcclCommunicator::split(int color, int key) {
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
  finish_state(*state);
  return std::make_shared<NcclCommunicator>(std::move(state));
}

// ---- bootstrap over MPI ------------------------------------------------------------------------

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

// The bootstrap's own duplicate of the caller's communicator: its traffic cannot match the
// caller's messages, and MPI errors come back as codes instead of killing the job.
class BootstrapComm {
 public:
  BootstrapComm(MPI_Comm parent, const CommOptions& options) : options_(options) {
    MPI_Comm_rank(parent, &rank_);
    MPI_Comm_size(parent, &size_);
    // Everyone must arrive before the blocking MPI_Comm_dup / MPI_Comm_split_type below, so a
    // rank that never calls nccl_world turns into a timeout here rather than a hang there.
    MPI_Request request;
    check(MPI_Ibarrier(parent, &request), "MPI_Ibarrier");
    wait(request, "MPI_Ibarrier");
    check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~BootstrapComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  BootstrapComm(const BootstrapComm&) = delete;
  BootstrapComm& operator=(const BootstrapComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  void check(int code, const char* call) const {
    if (code != MPI_SUCCESS) {
      raise(ErrorCode::comm, "nccl bootstrap: {} failed on rank {} of {}: {}", call, rank_, size_,
            mpi_error_text(code));
    }
  }

  void wait(MPI_Request& request, const char* call) const {
    const Deadline deadline(options_.timeout_seconds);
    const bool done = poll_until(deadline, [&] {
      int flag = 0;
      check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), call);
      return flag != 0;
    });
    if (!done) {
      raise(ErrorCode::timeout,
            "nccl bootstrap: {} on rank {} of {} did not complete within {:g} s: a rank did not "
            "call nccl_world/nccl_borrow, or is stuck",
            call, rank_, size_, deadline.seconds());
    }
  }

 private:
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

struct LocalSetup {
  int device = -1;
  std::string error;  // empty when this rank is ready
  ErrorCode code = ErrorCode::cuda;
};

LocalSetup choose_device(int local_rank, int local_size, void* stream) {
  LocalSetup setup;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    setup.error = fmt::format("no CUDA device: {}", status != cudaSuccess
                                                        ? cudaGetErrorString(status)
                                                        : "cudaGetDeviceCount reported 0 devices");
    return setup;
  }
  if (stream != nullptr) {
    // The caller chose the device when it made the stream.
    const cudaError_t got = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &setup.device);
    if (got != cudaSuccess) {
      cudaGetLastError();
      setup.error = fmt::format("the given stream is not usable: {}", cudaGetErrorString(got));
    }
    return setup;
  }
  if (local_size > count) {
    setup.error = fmt::format(
        "{} ranks share this node but it has {} CUDA device(s); NCCL needs one device per rank",
        local_size, count);
    setup.code = ErrorCode::unsupported;
    return setup;
  }
  setup.device = local_rank % count;
  return setup;
}

std::shared_ptr<Communicator> bootstrap(MPI_Comm parent, const CommOptions& options, void* stream,
                                        std::shared_ptr<Communicator> mpi_keepalive) {
  BootstrapComm boot(parent, options);
  const int rank = boot.rank();
  const int size = boot.size();

  MPI_Comm node = MPI_COMM_NULL;
  boot.check(MPI_Comm_split_type(boot.comm(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
             "MPI_Comm_split_type");
  int local_rank = 0;
  int local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  LocalSetup setup = choose_device(local_rank, local_size, stream);
  auto stream_holder = std::make_shared<StreamHolder>();
  ncclUniqueId id{};
  if (setup.error.empty()) {
    const cudaError_t status = cudaSetDevice(setup.device);
    if (status != cudaSuccess) {
      setup.error = fmt::format("cudaSetDevice({}) failed: {}", setup.device,
                                cudaGetErrorString(status));
    } else if (stream != nullptr) {
      stream_holder->stream = static_cast<cudaStream_t>(stream);
    } else {
      const cudaError_t made =
          cudaStreamCreateWithFlags(&stream_holder->stream, cudaStreamNonBlocking);
      if (made == cudaSuccess) {
        stream_holder->owned = true;
      } else {
        setup.error = fmt::format("cudaStreamCreate failed: {}", cudaGetErrorString(made));
      }
    }
  }
  if (setup.error.empty() && rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      setup.error = fmt::format("ncclGetUniqueId failed: {}", nccl_error_text(result, nullptr));
      setup.code = ErrorCode::comm;
    }
  }

  // Agree on readiness first: a rank that cannot take part makes every rank raise (naming
  // it) instead of leaving the others waiting inside NCCL's init.
  int ready = setup.error.empty() ? 1 : 0;
  std::vector<int> all_ready(static_cast<std::size_t>(size), 0);
  MPI_Request request;
  boot.check(MPI_Iallgather(&ready, 1, MPI_INT, all_ready.data(), 1, MPI_INT, boot.comm(), &request),
             "MPI_Iallgather");
  boot.wait(request, "MPI_Iallgather");
  if (!setup.error.empty()) {
    raise(setup.code, "nccl bootstrap on rank {} of {} (node-local rank {}): {}", rank, size,
          local_rank, setup.error);
  }
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (all_ready[static_cast<std::size_t>(r)] == 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    raise(ErrorCode::comm,
          "nccl bootstrap on rank {} of {}: rank(s) {} could not set up (see their errors); no "
          "communicator was created",
          rank, size, failed);
  }

  boot.check(MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, boot.comm(), &request),
             "MPI_Ibcast");
  boot.wait(request, "MPI_Ibcast(ncclUniqueId)");

  auto state = std::make_shared<NcclState>();
  state->device = setup.device;
  state->stream = std::move(stream_holder);
  state->options = options;
  state->rank = rank;
  state->size = size;
  state->mpi_keepalive = std::move(mpi_keepalive);
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t result = ncclCommInitRankConfig(&state->comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    ncclComm_t comm = state->comm;
    state->comm = nullptr;
    if (comm != nullptr) ncclCommAbort(comm);
    raise(ErrorCode::comm, "ncclCommInitRank on rank {} of {} (cuda:{}) failed: {}", rank, size,
          setup.device, nccl_error_text(result, nullptr));
  }
  state->settle(result, "ncclCommInitRank");
  finish_state(*state);
  return std::make_shared<NcclCommunicator>(std::move(state));
}

}  // namespace

bool nccl_compiled_in() { return true; }

std::shared_ptr<Communicator> nccl_world(const CommOptions& options, void* stream) {
  // mpi_world() initialises MPI when nobody has and finalises it after the last user; holding
  // it keeps MPI alive for as long as this communicator (and its splits) exist.
  std::shared_ptr<Communicator> host = mpi_world(options);
  return bootstrap(MPI_COMM_WORLD, options, stream, std::move(host));
}

std::shared_ptr<Communicator> nccl_borrow(const void* mpi_comm, const CommOptions& options,
                                          void* stream) {
  SHARDOPT_CHECK(mpi_comm != nullptr, invalid_argument, "nccl_borrow: the MPI_Comm pointer is null");
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARDOPT_CHECK(initialized, comm,
                 "nccl_borrow: MPI is not initialised; the caller owns MPI in this mode");
  return bootstrap(*static_cast<const MPI_Comm*>(mpi_comm), options, stream, nullptr);
}

void* nccl_stream(const Communicator& comm) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm);
  SHARDOPT_CHECK(nccl != nullptr, invalid_argument,
                 "nccl_stream: the communicator is a '{}' communicator, not nccl",
                 comm.backend_name());
  return nccl->stream();
}

}  // namespace shardopt
