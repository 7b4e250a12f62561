// shardopt/communicator.hpp — the Communicator users and the library hold (rank, size, collectives, split), and the MPI factories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardopt/export.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

enum class ReduceOp : int32_t { sum = 0, avg = 1, max = 2 };

// A collective started by a nonblocking call; wait() finishes it (and rethrows its failure).
class SHARDOPT_API PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class CommBackend;  // shardopt/comm_backend.hpp: what a transport implements
class Communicator;
// The transport under `comm`, for transports that wrap one (shardopt/comm_backend.hpp); users
// call `comm` itself.
SHARDOPT_API std::shared_ptr<CommBackend> backend_of(const Communicator& comm);

// One broadcast of a group (Communicator::broadcast_group_async): `count` elements at `buffer`
// from rank `root`.
struct BroadcastPart {
  void* buffer = nullptr;
  int64_t count = 0;
  int root = 0;
};

// Every rank passes the same options: mpi_world and mpi_borrow agree on them when the
// communicator is created (Error(mismatch) naming the field on every rank otherwise; 0 and +inf
// timeouts count as the same setting, the watchdog off).
struct CommOptions {
  // A collective that has not completed after this long raises Error(timeout) naming the
  // operation and rank instead of hanging forever, and poisons its communicator: the
  // collective cannot be cancelled (its buffers may still be written if the peer arrives
  // late), so every later call on that communicator, or on its other pending collectives,
  // raises Error(timeout) at once naming the collective that timed out. 0 disables the
  // watchdog (as does +inf); NaN and negative values are refused (Error(invalid_argument))
  // when the communicator is created.
  // Over MPI, the memory of a collective that timed out stays in MPI's hands until the late
  // peer joins it or MPI is finalised. shardopt keeps its own buffers (an optimizer's
  // gradients, parameters and staging, agreement records, checkpoint staging slots, averaging
  // buckets) allocated until then, even after their owner is destroyed. Buffers you passed to a
  // collective yourself (a Communicator call, the C ABI's collectives) or registered as
  // Storage::external (averaging reduces them in place) you must keep allocated until
  // MPI_Finalize has returned (with mpi_world, which finalises MPI at exit: until the process
  // exits), or MPI may write into freed memory.
  // Where shardopt initialised MPI it also finalises it at exit, and this bounds that too:
  // when the peers do not all reach exit within the longest timeout in use (one died or was
  // cut off), the process ends without MPI_Finalize, which would wait for it forever.
  double timeout_seconds = 600.0;
  // Which ranks form a node: those that can share host memory (MPI_COMM_TYPE_SHARED) when 0;
  // when n > 0, consecutive groups of n of those, each treated as a node of its own (to run
  // the multi-node paths on one machine, or to bound how many ranks share one buffer).
  // Negative values are refused (Error(invalid_argument)) when the communicator is created.
  int ranks_per_node = 0;
};

// Collectives over one group of ranks: what the library and its users hold and call. Counts
// are elements of `dtype`; buffers live on `device()`. All ranks of the group must call the
// same collectives in the same order.
//
// A Communicator is a handle over a transport (shardopt/comm_backend.hpp): mpi_world(),
// mpi_borrow(), nccl_world() and python's torch_communicator() make one over theirs; a new
// transport implements CommBackend and is wrapped as
// `std::make_shared<Communicator>(std::make_shared<MyBackend>(...))`. The calls here are not
// virtual: a user never overrides a collective, and a new transport changes nothing users call.
//
// broadcast and all_gather move any dtype bit for bit, DType::byte included (records of any
// size). Reductions (all_reduce, reduce_scatter, reduce) take f32, bf16 and f16 with sum, avg
// and max on every backend, and raise Error(unsupported) on byte; avg is the sum divided by
// size(). Over MPI (host buffers):
//  - f32: MPI_SUM / MPI_MAX; avg divides each element of the sum by size() in float on the
//    host, one step shared by all three collectives.
//  - bf16/f16: each pairwise combination of two ranks' values is done in float and rounded
//    back to the dtype to nearest even (which is the correctly rounded sum of the two); avg
//    divides the reduced sum by size() in float and rounds the quotient to nearest even. max
//    does not depend on the order: NaN if any rank has NaN, and +0 over -0.
// Hence, for the same inputs and world size, avg (like sum) is bitwise the same whichever
// collective produced it whenever the sums are the same, which holds for 1 or 2 ranks
// (addition commutes) and whenever every partial sum is exact in the dtype (e.g. small
// integers). With 3 or more ranks and inexact sums, MPI's algorithms (which differ between
// collectives, world sizes and message sizes) may associate the additions differently, so the
// results may differ in rounding. Over NCCL, avg is ncclAvg and sums follow NCCL's own order.
class SHARDOPT_API Communicator final {
 public:
  // Error(invalid_argument) when `backend` is null.
  explicit Communicator(std::shared_ptr<CommBackend> backend);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  Device device() const;
  const char* backend_name() const;  // for messages and logs only
  // Whether collectives accept buffers in CUDA device memory (NCCL; a CUDA-aware MPI).
  bool cuda_aware() const;
  // The cudaStream_t (as void*) on which this communicator runs its collectives, ordered with
  // other work on that stream (NCCL); null when collectives run on the host's timeline.
  void* cuda_stream() const;
  // CommOptions.timeout_seconds of the transport (0 when it has no watchdog).
  double timeout_seconds() const;

  void broadcast(void* buffer, int64_t count, DType dtype, int root);
  // Rank r's `count` elements land at recv + r*count. In place when send == recv + rank*count.
  void all_gather(const void* send, void* recv, int64_t count, DType dtype);
  // `send` holds size()*count elements; this rank receives the reduced block rank()*count.
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
  void all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op);
  // Reduces every rank's `count` elements of `send` into `recv` on `root` (recv is ignored on
  // other ranks). In place on the root when send == recv.
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root);
  void barrier();

  // The nonblocking forms: each returns once the collective is started; its buffers must stay
  // untouched until wait() returns.
  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype, int root);
  // `count` broadcasts (each as broadcast_async), issued as one group: a backend that can
  // launches them together (NCCL: ncclGroupStart/End, so the per-root pieces of one exchange run
  // concurrently and complete as one); others start them one by one. One wait() finishes them
  // all. Every rank passes the same parts in the same order.
  std::unique_ptr<PendingCollective> broadcast_group_async(const BroadcastPart* parts, std::size_t count,
                                                           DType dtype);
  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count, DType dtype);
  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype, ReduceOp op);
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv, int64_t count,
                                                          DType dtype, ReduceOp op);
  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count, DType dtype,
                                                  ReduceOp op, int root);

  // Ranks passing the same color form a new group, ordered by key (ties by old rank); a rank
  // passing a negative color joins no group and gets null. Collective over this group.
  std::shared_ptr<Communicator> split(int color, int key);
  // Node locality. Collective over this group: the ranks of it on this rank's node (see
  // CommOptions.ranks_per_node), ordered as here, all of which can map the same host memory;
  // null on every rank when this backend cannot share host memory between its ranks (NCCL).
  std::shared_ptr<Communicator> split_node();

 private:
  friend std::shared_ptr<CommBackend> backend_of(const Communicator& comm);  // comm_backend.hpp
  std::shared_ptr<CommBackend> backend_;
};

// MPI backend over host memory. The first form initialises MPI if nobody has. MPI can be
// initialised only once per process, so it then stays initialised until the process exits
// (destroying the last communicator does not finalise it), and is finalised at exit only if
// shardopt initialised it. cuda_aware() says whether this MPI library takes device pointers.
SHARDOPT_API std::shared_ptr<Communicator> mpi_world(const CommOptions& options = {});
// Borrows the caller's communicator: `mpi_comm` points at an MPI_Comm (opaque here so this
// header needs no mpi.h). shardopt duplicates it and never finalises MPI.
SHARDOPT_API std::shared_ptr<Communicator> mpi_borrow(const void* mpi_comm, const CommOptions& options = {});

}  // namespace shardopt
