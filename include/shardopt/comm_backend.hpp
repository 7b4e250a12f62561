// shardopt/comm_backend.hpp — the interface a transport implements (MPI, NCCL, a torch process group, a test's fake) beneath a Communicator.
//
// Users and the library hold a Communicator (shardopt/communicator.hpp); a Communicator calls
// its CommBackend. A new transport derives from CommBackend, implements the calls marked
// "required" and wraps itself: `std::make_shared<Communicator>(std::make_shared<MyBackend>())`.
// Each call has the semantics of the Communicator call of the same name (counts, dtypes,
// in-place forms, reductions, collective order); a backend raises shardopt::Error, never
// aborts, and bounds every wait by its CommOptions.timeout_seconds where it has one.
// A backend that wraps another transport (the communication thread's serialising wrapper,
// host staging over NCCL, a test's fault injector) holds the inner Communicator and calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "shardopt/communicator.hpp"
#include "shardopt/export.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

class SHARDOPT_API CommBackend {
 public:
  virtual ~CommBackend() = default;

  // Required: who this rank is, and where the buffers of its collectives live.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  virtual const char* backend_name() const = 0;  // for messages and logs only

  // Required: the nonblocking collectives (each returns once started; its PendingCollective's
  // wait() finishes it and rethrows its failure), the barrier, and split. A rank passing a
  // negative color to split joins no group: return null.
  virtual std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype,
                                                             int root) = 0;
  virtual std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                              DType dtype) = 0;
  virtual std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                              ReduceOp op) = 0;
  virtual std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv,
                                                                  int64_t count, DType dtype,
                                                                  ReduceOp op) = 0;
  virtual std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count,
                                                          DType dtype, ReduceOp op, int root) = 0;
  virtual void barrier() = 0;
  virtual std::shared_ptr<CommBackend> split(int color, int key) = 0;

  // Optional: the blocking collectives. The defaults start the nonblocking form and wait; a
  // backend overrides them where a blocking call is cheaper.
  virtual void broadcast(void* buffer, int64_t count, DType dtype, int root);
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype);
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
  virtual void all_reduce(void* buffer, int64_t count, DType dtype, ReduceOp op);
  virtual void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root);
  // Optional: the default starts the broadcasts one by one; NCCL launches them as one group.
  virtual std::unique_ptr<PendingCollective> broadcast_group_async(const BroadcastPart* parts,
                                                                   std::size_t count, DType dtype);

  // Optional capabilities, with the defaults of a host-memory transport that shares no memory.
  // Whether collectives take CUDA device buffers, and the stream they are ordered on (as void*).
  virtual bool cuda_aware() const { return false; }
  virtual void* cuda_stream() const { return nullptr; }
  // The ranks of this group on this rank's node that can map the same host memory (see
  // Communicator::split_node); null on every rank when the transport cannot share host memory.
  virtual std::shared_ptr<CommBackend> split_node() { return nullptr; }
  // Raises (Error(unsupported), naming what is missing) when this transport cannot be called
  // from a thread other than the one that set it up, as the optimizer's communication thread
  // does under config.overlap (e.g. MPI below MPI_THREAD_SERIALIZED). The default allows it.
  virtual void require_serialized_calls() const {}
  // The seconds the optimizer's own waits on peers outside collectives (the node's gradient
  // slots) may take before Error(timeout); 0 waits without bound. The default is CommOptions'
  // default, so a transport that shares memory but does not say stays bounded: never a hang.
  virtual double timeout_seconds() const { return CommOptions{}.timeout_seconds; }
};

// The transport under `comm`. For backends that wrap a Communicator and hand its split
// children out unchanged, and for code that asks a transport about itself; users call `comm`.
SHARDOPT_API std::shared_ptr<CommBackend> backend_of(const Communicator& comm);

}  // namespace shardopt
