// src/comm/mpi/mpi_communicator.cpp — the MPI transport (CommBackend) on host buffers, and the mpi_world/mpi_borrow factories.
//
// Every collective is issued nonblocking and completed by the bounded wait of
// comm/mpi/mpi_watchdog.hpp, so a dead or diverged peer turns into Error(timeout) naming the
// operation and rank instead of an endless hang, and poisons the communicator. The
// communicator works on a duplicate of the caller's MPI_Comm, with MPI_ERRORS_RETURN so that
// MPI failures become Errors as well.
//
// Reductions: f32 uses MPI_SUM / MPI_MAX on MPI_FLOAT; bf16 and f16 travel as MPI_UINT16_T
// with user-defined operations (comm/mpi/half_ops.hpp). avg is always the sum followed by a
// division by the world size on the host, in the one place (divide_by_size) that every
// reducing collective uses, so that avg equals sum / size bit for bit whichever collective
// produced the sum. byte (MPI_BYTE) only moves: every reduction refuses it.
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>

#include "comm/agreement.hpp"
#include "comm/mpi/half_ops.hpp"
#include "comm/mpi/half_reduce.hpp"
#include "comm/mpi/mpi_comm_of.hpp"
#include "comm/mpi/mpi_cuda_support.hpp"
#include "comm/mpi/mpi_runtime.hpp"
#include "comm/mpi/mpi_watchdog.hpp"
#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "shardopt/comm_backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {
namespace {

MPI_Datatype mpi_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    // 16-bit floats travel as raw 16-bit words; only reductions need to know their meaning.
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::byte: return MPI_BYTE;
  }
  raise(ErrorCode::invalid_argument, "{} over MPI: unknown dtype {}", op, static_cast<int>(dtype));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "unknown";
}

// The MPI operation for `op` on `dtype` (avg: the sum; divide_by_size finishes it).
MPI_Op mpi_op(DType dtype, ReduceOp op, const char* name) {
  SHARDOPT_CHECK(dtype != DType::byte, unsupported,
                 "{} over MPI cannot reduce dtype byte: byte is raw bytes that collectives move "
                 "(broadcast, all_gather) without arithmetic; reductions take f32, bf16 and f16",
                 name);
  const bool known_op = op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::max;
  const bool known_dtype = dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
  SHARDOPT_CHECK(known_op && known_dtype, unsupported,
                 "{} over MPI does not support reduce op {} ({}) on dtype {} ({}): the MPI "
                 "backend reduces f32, bf16 and f16 with sum, avg and max",
                 name, reduce_op_name(op), static_cast<int>(op), dtype_name(dtype),
                 static_cast<int>(dtype));
  if (dtype == DType::f32) return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  return half_op(dtype, op);
}

// avg's last step, on the host, for every reducing collective: each element of the sum
// divided by the world size in float (and, for bf16/f16, rounded back to nearest even).
void divide_by_size(void* data, int64_t count, DType dtype, int size) {
  const float n = static_cast<float>(size);
  if (dtype == DType::f32) {
    auto* values = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) values[i] = values[i] / n;
    return;
  }
  auto* words = static_cast<uint16_t*>(data);
  if (dtype == DType::bf16) {
    for (int64_t i = 0; i < count; ++i) words[i] = average_word<Bf16Words>(words[i], n);
  } else {
    for (int64_t i = 0; i < count; ++i) words[i] = average_word<F16Words>(words[i], n);
  }
}

// The bytes of `count` elements of `dtype` at `data`, times `blocks` (a block per rank).
core::ByteRange span(const void* data, int64_t count, DType dtype, int blocks = 1) {
  return core::ByteRange{data, static_cast<std::size_t>(count) * dtype_size(dtype) * static_cast<std::size_t>(blocks)};
}

int checked_count(int64_t count, const char* op) {
  SHARDOPT_CHECK(count >= 0, invalid_argument, "{}: negative count {}", op, count);
  SHARDOPT_CHECK(count <= INT_MAX, unsupported, "{}: count {} exceeds the MPI limit of {} elements per call",
                 op, count, INT_MAX);
  return static_cast<int>(count);
}

class MpiBackend final : public CommBackend {
 public:
  MpiBackend(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent, const CommOptions& options)
      : state_(std::make_shared<MpiCommState>(std::move(runtime), parent, options)),
        // Asked once: the answer is the loaded MPI library's and cannot change.
        cuda_aware_(mpi_support::mpi_cuda_aware(nullptr)) {}

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  Device device() const override { return Device::cpu(); }
  const char* backend_name() const override { return "mpi"; }
  bool cuda_aware() const override { return cuda_aware_; }
  void* cuda_stream() const override { return nullptr; }
  void require_serialized_calls() const override { require_serialized_thread_level(); }
  double timeout_seconds() const override { return state_->options().timeout_seconds; }
  MPI_Comm mpi_comm() const { return state_->comm(); }

  // The blocking collectives are CommBackend's: start the nonblocking form, then wait.
  void barrier() override {
    state_->check_usable("barrier");
    MPI_Request request;
    state_->check(MPI_Ibarrier(state_->comm(), &request), "MPI_Ibarrier");
    MpiPending(state_, "barrier", request).wait();
  }

  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype,
                                                     int root) override {
    state_->check_usable("broadcast");
    const int n = checked_count(count, "broadcast");
    const MPI_Datatype type = mpi_type(dtype, "broadcast");
    SHARDOPT_CHECK(root >= 0 && root < size(), invalid_argument,
                   "broadcast: root {} is not a rank of this {}-rank communicator", root, size());
    MPI_Request request;
    state_->check(MPI_Ibcast(buffer, n, type, root, state_->comm(), &request), "MPI_Ibcast");
    return std::make_unique<MpiPending>(state_, "broadcast", request, TouchedMemory{span(buffer, count, dtype)});
  }

  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override {
    state_->check_usable("all_gather");
    const int n = checked_count(count, "all_gather");
    const MPI_Datatype type = mpi_type(dtype, "all_gather");
    const auto* own_block = static_cast<const char*>(recv) + static_cast<std::size_t>(rank()) *
                                                                 static_cast<std::size_t>(count) *
                                                                 dtype_size(dtype);
    const void* source = (send == own_block) ? MPI_IN_PLACE : send;
    MPI_Request request;
    state_->check(MPI_Iallgather(source, n, type, recv, n, type, state_->comm(), &request),
                  "MPI_Iallgather");
    return std::make_unique<MpiPending>(state_, "all_gather", request,
                                        TouchedMemory{span(send, count, dtype), span(recv, count, dtype, size())});
  }

  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override {
    state_->check_usable("all_reduce");
    const int n = checked_count(count, "all_reduce");
    const MPI_Op reduction = mpi_op(dtype, op, "all_reduce");
    MPI_Request request;
    state_->check(MPI_Iallreduce(MPI_IN_PLACE, buffer, n, mpi_type(dtype, "all_reduce"), reduction,
                                 state_->comm(), &request),
                  "MPI_Iallreduce");
    auto pending = std::make_unique<MpiPending>(state_, "all_reduce", request, TouchedMemory{span(buffer, count, dtype)});
    if (op == ReduceOp::avg) {
      pending->finish = [buffer, count, dtype, size = size()] {
        divide_by_size(buffer, count, dtype, size);
      };
    }
    return pending;
  }

  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                          int64_t count, DType dtype,
                                                          ReduceOp op) override {
    state_->check_usable("reduce_scatter");
    const int n = checked_count(count, "reduce_scatter");
    const MPI_Op reduction = mpi_op(dtype, op, "reduce_scatter");
    MPI_Request request;
    state_->check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(dtype, "reduce_scatter"),
                                            reduction, state_->comm(), &request),
                  "MPI_Ireduce_scatter_block");
    auto pending = std::make_unique<MpiPending>(state_, "reduce_scatter", request,
                                                TouchedMemory{span(send, count, dtype, size()), span(recv, count, dtype)});
    if (op == ReduceOp::avg) {
      pending->finish = [recv, count, dtype, size = size()] {
        divide_by_size(recv, count, dtype, size);
      };
    }
    return pending;
  }

  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                  DType dtype, ReduceOp op, int root) override {
    state_->check_usable("reduce");
    const int n = checked_count(count, "reduce");
    SHARDOPT_CHECK(root >= 0 && root < size(), invalid_argument,
                   "reduce: root {} is not a rank of this {}-rank communicator", root, size());
    const MPI_Op reduction = mpi_op(dtype, op, "reduce");
    const bool is_root = rank() == root;
    // MPI_IN_PLACE is the root's alone; elsewhere recv is not significant.
    const void* source = (is_root && send == recv) ? MPI_IN_PLACE : send;
    MPI_Request request;
    state_->check(MPI_Ireduce(source, is_root ? recv : nullptr, n, mpi_type(dtype, "reduce"),
                              reduction, root, state_->comm(), &request),
                  "MPI_Ireduce");
    auto pending = std::make_unique<MpiPending>(state_, "reduce", request,
                                                TouchedMemory{span(send, count, dtype), span(is_root ? recv : nullptr, count, dtype)});
    if (op == ReduceOp::avg && is_root) {
      pending->finish = [recv, count, dtype, size = size()] {
        divide_by_size(recv, count, dtype, size);
      };
    }
    return pending;
  }

  std::shared_ptr<CommBackend> split(int color, int key) override {
    state_->check_usable("split");
    meet_before_blocking_call("split");
    MPI_Comm child = MPI_COMM_NULL;
    state_->check(MPI_Comm_split(state_->comm(), color < 0 ? MPI_UNDEFINED : color, key, &child),
                  "MPI_Comm_split");
    if (child == MPI_COMM_NULL) return nullptr;
    return adopt(child);
  }

  std::shared_ptr<CommBackend> split_node() override {
    state_->check_usable("split_node");
    meet_before_blocking_call("split_node");
    MPI_Comm shared = MPI_COMM_NULL;
    state_->check(MPI_Comm_split_type(state_->comm(), MPI_COMM_TYPE_SHARED, state_->rank(), MPI_INFO_NULL, &shared),
                  "MPI_Comm_split_type");
    MPI_Comm node = shared;
    const int per_node = state_->options().ranks_per_node;
    if (per_node > 0) {
      int local = 0;
      MPI_Comm_rank(shared, &local);
      const int status = MPI_Comm_split(shared, local / per_node, local, &node);
      MPI_Comm_free(&shared);
      state_->check(status, "MPI_Comm_split");
    }
    return adopt(node);
  }

 private:
  // MPI_Comm_split and MPI_Comm_split_type block with no deadline: all ranks meet in a watched
  // barrier first, so a rank that never calls becomes a timeout here instead of a hang there.
  void meet_before_blocking_call(const char* op) {
    MPI_Request request;
    state_->check(MPI_Ibarrier(state_->comm(), &request), "MPI_Ibarrier");
    MpiPending(state_, op, request).wait();
  }
  // A communicator over `child`, which is freed either way (the new one holds its duplicate).
  std::shared_ptr<CommBackend> adopt(MPI_Comm& child) {
    std::shared_ptr<CommBackend> result;
    try {
      result = std::make_shared<MpiBackend>(state_->runtime(), child, state_->options());
    } catch (...) {
      MPI_Comm_free(&child);
      throw;
    }
    MPI_Comm_free(&child);
    return result;
  }

  std::shared_ptr<MpiCommState> state_;
  bool cuda_aware_ = false;
};

// The options a rank creates its communicator with while the ranks have yet to agree on them:
// its own when valid; otherwise the defaults, so that the creation itself stays bounded and
// the agreement can refuse the invalid value on every rank.
CommOptions options_to_create_with(const CommOptions& options) {
  CommOptions usable = options;
  if (std::isnan(options.timeout_seconds) || options.timeout_seconds < 0) {
    usable.timeout_seconds = CommOptions{}.timeout_seconds;
  }
  if (options.ranks_per_node < 0) usable.ranks_per_node = CommOptions{}.ranks_per_node;
  return usable;
}

// Collective over the new communicator, once, where it is created (its split children inherit
// the agreed options). Every field of CommOptions decides collective paths, so the ranks must
// hold the same values or all raise Error(mismatch) naming the field:
//  - ranks_per_node: split_node() runs MPI_Comm_split on the ranks with a positive value only;
//    the others would go on to the new communicator's barrier and MPI_Comm_dup, and both hang.
//  - timeout_seconds: with the watchdog off (0 or +inf) a process skips MpiRuntime's watched
//    barrier on MPI_COMM_WORLD at exit that the others enter; with different positive values a
//    rank gives up on a collective (and poisons its communicator) while its peers still wait.
// A value that fails validation on any rank fails the creation on every rank.
void agree_on_options(Communicator& comm, const CommOptions& options, const char* factory) {
  AgreementRecord record(factory);
  record.validate([&] { check_timeout_option(options, factory); });
  record.field("CommOptions.ranks_per_node", std::to_string(options.ranks_per_node));
  // 0 and +inf both mean "no watchdog": the same setting.
  const bool watched = options.timeout_seconds > 0 && !std::isinf(options.timeout_seconds);
  record.field("CommOptions.timeout_seconds", watched ? fmt::format("{}", options.timeout_seconds) : "0 (no watchdog)");
  agree(comm, record);
}

std::shared_ptr<Communicator> create_agreed(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent,
                                            const CommOptions& options, const char* factory) {
  auto created =
      std::make_shared<Communicator>(std::make_shared<MpiBackend>(runtime, parent, options_to_create_with(options)));
  agree_on_options(*created, options, factory);
  // Only now may the timeout bound the exit barrier: noted before the agreement, a rank whose
  // creation was refused could still enter that barrier alone.
  if (runtime) runtime->note_timeout(options.timeout_seconds);
  return created;
}

}  // namespace

MPI_Comm mpi_comm_of(Communicator& communicator) {
  const std::shared_ptr<CommBackend> backend = backend_of(communicator);
  const auto* mpi = dynamic_cast<const MpiBackend*>(backend.get());
  return mpi != nullptr ? mpi->mpi_comm() : MPI_COMM_NULL;
}

}  // namespace comm

std::shared_ptr<Communicator> mpi_world(const CommOptions& options) {
  return comm::create_agreed(comm::shared_mpi_runtime(), MPI_COMM_WORLD, options, "mpi_world");
}

std::shared_ptr<Communicator> mpi_borrow(const void* mpi_comm, const CommOptions& options) {
  SHARDOPT_CHECK(mpi_comm != nullptr, invalid_argument, "mpi_borrow: the MPI_Comm pointer is null");
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARDOPT_CHECK(initialized, comm, "mpi_borrow: MPI is not initialised; the caller owns MPI in this mode");
  // A borrowed communicator never finalises MPI: no runtime is attached.
  return comm::create_agreed(nullptr, *static_cast<const MPI_Comm*>(mpi_comm), options, "mpi_borrow");
}

}  // namespace shardopt
