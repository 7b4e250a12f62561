// src/comm/mpi/mpi_communicator.cpp — the Communicator over MPI on host buffers, with a watchdog.
//
// Every collective is issued nonblocking and completed by polling MPI_Test against a deadline,
// so a dead or diverged peer turns into Error(timeout) naming the operation and rank instead
// of an endless hang. The communicator works on a duplicate of the caller's MPI_Comm, with
// MPI_ERRORS_RETURN so that MPI failures become Errors as well.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <functional>
#include <mutex>
#include <thread>

#include "core/check.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace {

// Initialises MPI when shardopt is the first to use it, and then finalises it at exit.
class MpiRuntime {
 public:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        raise(ErrorCode::comm, "MPI_Init_thread failed");
      }
      owns_ = true;
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

 private:
  bool owns_ = false;
};

MPI_Datatype mpi_type(DType dtype) {
  // 16-bit floats travel as raw 16-bit words; only reductions need to know their meaning.
  return dtype == DType::f32 ? MPI_FLOAT : MPI_UINT16_T;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

int checked_count(int64_t count, const char* op) {
  SHARDOPT_CHECK(count >= 0, invalid_argument, "{}: negative count {}", op, count);
  SHARDOPT_CHECK(count <= INT_MAX, unsupported, "{}: count {} exceeds the MPI limit of {} elements per call",
                 op, count, INT_MAX);
  return static_cast<int>(count);
}

class MpiCommunicator;

class MpiPending final : public PendingCollective {
 public:
  MpiPending(const MpiCommunicator* comm, const char* op, MPI_Request request)
      : comm_(comm), op_(op), request_(request) {}
  // Runs after completion (the average's division).
  std::function<void()> finish;
  void wait() override;

 private:
  const MpiCommunicator* comm_;
  const char* op_;
  MPI_Request request_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent, const CommOptions& options)
      : runtime_(std::move(runtime)), options_(options) {
    check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  const char* backend_name() const override { return "mpi"; }

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
    const int n = checked_count(count, "reduce_scatter");
    check_reducible(dtype, "reduce_scatter");
    MPI_Request request;
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), mpi_op(op), comm_, &request),
          "MPI_Ireduce_scatter_block");
    MpiPending pending(this, "reduce_scatter", request);
    pending.wait();
    if (op == ReduceOp::avg) divide_by_size(static_cast<float*>(recv), count);
  }
  void barrier() override {
    MPI_Request request;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    MpiPending(this, "barrier", request).wait();
  }

  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype,
                                                     int root) override {
    const int n = checked_count(count, "broadcast");
    SHARDOPT_CHECK(root >= 0 && root < size_, invalid_argument,
                   "broadcast: root {} is not a rank of this {}-rank communicator", root, size_);
    MPI_Request request;
    check(MPI_Ibcast(buffer, n, mpi_type(dtype), root, comm_, &request), "MPI_Ibcast");
    return std::make_unique<MpiPending>(this, "broadcast", request);
  }

  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override {
    const int n = checked_count(count, "all_gather");
    const auto* own_block = static_cast<const char*>(recv) +
                            static_cast<std::size_t>(rank_) * static_cast<std::size_t>(count) * dtype_size(dtype);
    const void* source = (send == own_block) ? MPI_IN_PLACE : send;
    MPI_Request request;
    check(MPI_Iallgather(source, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, &request),
          "MPI_Iallgather");
    return std::make_unique<MpiPending>(this, "all_gather", request);
  }

  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override {
    const int n = checked_count(count, "all_reduce");
    check_reducible(dtype, "all_reduce");
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, buffer, n, mpi_type(dtype), mpi_op(op), comm_, &request),
          "MPI_Iallreduce");
    auto pending = std::make_unique<MpiPending>(this, "all_reduce", request);
    if (op == ReduceOp::avg) {
      pending->finish = [this, buffer, count] { divide_by_size(static_cast<float*>(buffer), count); };
    }
    return pending;
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    MPI_Comm child = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split");
    if (child == MPI_COMM_NULL) return nullptr;
    auto result = std::make_shared<MpiCommunicator>(runtime_, child, options_);
    MPI_Comm_free(&child);  // the new communicator holds its own duplicate
    return result;
  }

  void check(int code, const char* call) const {
    if (code != MPI_SUCCESS) {
      raise(ErrorCode::comm, "{} failed on rank {} of {}: {}", call, rank_, size_, mpi_error_string(code));
    }
  }
  double timeout_seconds() const { return options_.timeout_seconds; }

 private:
  static MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }
  void check_reducible(DType dtype, const char* op) const {
    SHARDOPT_CHECK(dtype == DType::f32, unsupported, "{} over MPI supports f32 only, got {}", op,
                   dtype_name(dtype));
  }
  void divide_by_size(float* data, int64_t count) const {
    const float n = static_cast<float>(size_);
    for (int64_t i = 0; i < count; ++i) data[i] = data[i] / n;
  }

  std::shared_ptr<MpiRuntime> runtime_;
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

void MpiPending::wait() {
  if (request_ == MPI_REQUEST_NULL) return;
  using Clock = std::chrono::steady_clock;
  const double limit = comm_->timeout_seconds();
  const auto start = Clock::now();
  for (uint64_t spin = 0;; ++spin) {
    int done = 0;
    comm_->check(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    // Yield so oversubscribed ranks let their peers run; read the clock now and then only.
    std::this_thread::yield();
    if (limit > 0 && (spin & 1023) == 1023) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (waited > limit) {
        raise(ErrorCode::timeout,
              "{} on rank {} of {} did not complete within {:.0f} s: a peer is dead, stuck, or "
              "issued a different collective",
              op_, comm_->rank(), comm_->size(), limit);
      }
    }
  }
  request_ = MPI_REQUEST_NULL;
  if (finish) finish();
}

std::shared_ptr<MpiRuntime> shared_runtime() {
  // MPI can be initialised once per process, so the runtime lives until exit (a static) and
  // finalises MPI then, after the last communicator that shardopt handed out.
  static std::mutex mutex;
  static std::shared_ptr<MpiRuntime> runtime;
  std::lock_guard<std::mutex> lock(mutex);
  if (!runtime) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    SHARDOPT_CHECK(!finalized, comm, "MPI has already been finalized in this process");
    runtime = std::make_shared<MpiRuntime>();
  }
  return runtime;
}

}  // namespace

std::shared_ptr<Communicator> mpi_world(const CommOptions& options) {
  return std::make_shared<MpiCommunicator>(shared_runtime(), MPI_COMM_WORLD, options);
}

std::shared_ptr<Communicator> mpi_borrow(const void* mpi_comm, const CommOptions& options) {
  SHARDOPT_CHECK(mpi_comm != nullptr, invalid_argument, "mpi_borrow: the MPI_Comm pointer is null");
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARDOPT_CHECK(initialized, comm, "mpi_borrow: MPI is not initialised; the caller owns MPI in this mode");
  // A borrowed communicator never finalises MPI: no runtime is attached.
  return std::make_shared<MpiCommunicator>(nullptr, *static_cast<const MPI_Comm*>(mpi_comm), options);
}

}  // namespace shardopt
