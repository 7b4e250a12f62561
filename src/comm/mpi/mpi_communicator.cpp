// src/comm/mpi/mpi_communicator.cpp — the Communicator over MPI on host buffers, with a watchdog.
//
// Every collective is issued nonblocking and completed by polling MPI_Test against a deadline,
// so a dead or diverged peer turns into Error(timeout) naming the operation and rank instead
// of an endless hang. The communicator works on a duplicate of the caller's MPI_Comm, with
// MPI_ERRORS_RETURN so that MPI failures become Errors as well.
//
// Reductions: f32 uses MPI_SUM / MPI_MAX on MPI_FLOAT; bf16 and f16 travel as MPI_UINT16_T
// with user-defined operations (comm/mpi/half_reduce.hpp). avg is always the sum followed by a
// division by the world size on the host, in the one place (divide_by_size) that every
// reducing collective uses, so that avg equals sum / size bit for bit whichever collective
// produced the sum.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/mpi/half_reduce.hpp"
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

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "unknown";
}

// MPI's user function: inout[i] = Combine(in[i], inout[i]) over 16-bit words.
template <uint16_t (*Combine)(uint16_t, uint16_t)>
void combine_words(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Combine(a[i], b[i]);
}

// The user-defined MPI_Ops for bf16/f16 sum and max, made once per process on first use and
// freed at the start of MPI_Finalize (whoever calls it, shardopt or the application that lent
// its communicator): MPI deletes MPI_COMM_SELF's attributes first thing in MPI_Finalize, and
// the attribute set here frees the operations in its delete callback.
class HalfOps {
 public:
  // Index: [dtype == f16][op == max].
  static MPI_Op get(DType dtype, ReduceOp op) {
    std::lock_guard<std::mutex> lock(mutex());
    Table& t = table();
    if (!t.made) make(t);
    return t.ops[dtype == DType::f16 ? 1 : 0][op == ReduceOp::max ? 1 : 0];
  }

 private:
  struct Table {
    bool made = false;
    MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  };
  // Never destroyed: MPI_Finalize may run from another static's destructor (MpiRuntime's).
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static Table& table() {
    static auto* t = new Table();
    return *t;
  }

  static void make(Table& t) {
    MPI_User_function* const functions[2][2] = {
        {&combine_words<comm::sum_words<comm::Bf16Words>>,
         &combine_words<comm::max_words<comm::Bf16Words>>},
        {&combine_words<comm::sum_words<comm::F16Words>>,
         &combine_words<comm::max_words<comm::F16Words>>}};
    for (int d = 0; d < 2; ++d) {
      for (int o = 0; o < 2; ++o) {
        const int code = MPI_Op_create(functions[d][o], /*commute=*/1, &t.ops[d][o]);
        if (code != MPI_SUCCESS) {
          free_ops(t);
          raise(ErrorCode::comm, "MPI_Op_create for the bf16/f16 reductions failed: {}",
                mpi_error_string(code));
        }
      }
    }
    int keyval = MPI_KEYVAL_INVALID;
    int code = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_finalize, &keyval, nullptr);
    if (code == MPI_SUCCESS) code = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    if (code != MPI_SUCCESS) {
      free_ops(t);
      if (keyval != MPI_KEYVAL_INVALID) MPI_Comm_free_keyval(&keyval);
      raise(ErrorCode::comm, "registering the bf16/f16 reductions for MPI_Finalize failed: {}",
            mpi_error_string(code));
    }
    // MPI keeps the key value alive while the attribute uses it.
    MPI_Comm_free_keyval(&keyval);
    t.made = true;
  }

  static void free_ops(Table& t) {
    for (auto& row : t.ops) {
      for (MPI_Op& op : row) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
        op = MPI_OP_NULL;
      }
    }
    t.made = false;
  }

  static int on_finalize(MPI_Comm, int, void*, void*) {
    std::lock_guard<std::mutex> lock(mutex());
    free_ops(table());
    return MPI_SUCCESS;
  }
};

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
    reduce_scatter_async(send, recv, count, dtype, op)->wait();
  }
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
              int root) override {
    reduce_async(send, recv, count, dtype, op, root)->wait();
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
    const MPI_Op reduction = mpi_op(dtype, op, "all_reduce");
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, buffer, n, mpi_type(dtype), reduction, comm_, &request),
          "MPI_Iallreduce");
    auto pending = std::make_unique<MpiPending>(this, "all_reduce", request);
    if (op == ReduceOp::avg) {
      pending->finish = [this, buffer, count, dtype] { divide_by_size(buffer, count, dtype); };
    }
    return pending;
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                          int64_t count, DType dtype,
                                                          ReduceOp op) override {
    const int n = checked_count(count, "reduce_scatter");
    const MPI_Op reduction = mpi_op(dtype, op, "reduce_scatter");
    MPI_Request request;
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype), reduction, comm_, &request),
          "MPI_Ireduce_scatter_block");
    auto pending = std::make_unique<MpiPending>(this, "reduce_scatter", request);
    if (op == ReduceOp::avg) {
      pending->finish = [this, recv, count, dtype] { divide_by_size(recv, count, dtype); };
    }
    return pending;
  }

  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                  DType dtype, ReduceOp op, int root) override {
    const int n = checked_count(count, "reduce");
    SHARDOPT_CHECK(root >= 0 && root < size_, invalid_argument,
                   "reduce: root {} is not a rank of this {}-rank communicator", root, size_);
    const MPI_Op reduction = mpi_op(dtype, op, "reduce");
    const bool is_root = rank_ == root;
    // MPI_IN_PLACE is the root's alone; elsewhere recv is not significant.
    const void* source = (is_root && send == recv) ? MPI_IN_PLACE : send;
    MPI_Request request;
    check(MPI_Ireduce(source, is_root ? recv : nullptr, n, mpi_type(dtype), reduction, root, comm_,
                      &request),
          "MPI_Ireduce");
    auto pending = std::make_unique<MpiPending>(this, "reduce", request);
    if (op == ReduceOp::avg && is_root) {
      pending->finish = [this, recv, count, dtype] { divide_by_size(recv, count, dtype); };
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
  // The MPI operation for `op` on `dtype` (avg: the sum; divide_by_size finishes it).
  MPI_Op mpi_op(DType dtype, ReduceOp op, const char* name) const {
    const bool known_op = op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::max;
    const bool known_dtype = dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
    SHARDOPT_CHECK(known_op && known_dtype, unsupported,
                   "{} over MPI does not support reduce op {} ({}) on dtype {} ({}): the MPI "
                   "backend reduces f32, bf16 and f16 with sum, avg and max",
                   name, reduce_op_name(op), static_cast<int>(op), dtype_name(dtype),
                   static_cast<int>(dtype));
    if (dtype == DType::f32) return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    return HalfOps::get(dtype, op);
  }

  // avg's last step, on the host, for every reducing collective: each element of the sum
  // divided by the world size in float (and, for bf16/f16, rounded back to nearest even).
  void divide_by_size(void* data, int64_t count, DType dtype) const {
    const float n = static_cast<float>(size_);
    if (dtype == DType::f32) {
      auto* values = static_cast<float*>(data);
      for (int64_t i = 0; i < count; ++i) values[i] = values[i] / n;
      return;
    }
    auto* words = static_cast<uint16_t*>(data);
    if (dtype == DType::bf16) {
      for (int64_t i = 0; i < count; ++i) words[i] = comm::average_word<comm::Bf16Words>(words[i], n);
    } else {
      for (int64_t i = 0; i < count; ++i) words[i] = comm::average_word<comm::F16Words>(words[i], n);
    }
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
