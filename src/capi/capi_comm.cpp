// src/capi/capi_comm.cpp — the C functions over communicators: MPI world/borrow, NCCL, split, destroy, rank, size, barrier.
#include "capi/boundary.hpp"

namespace shardopt {
namespace capi {
namespace {

CommOptions comm_options_from(const shardopt_comm_options* options) {
  CommOptions result;
  if (options != nullptr) {
    check_struct(options, "options", "shardopt_comm_options");
    result.timeout_seconds = options->timeout_seconds;
    // An earlier header's struct ends at timeout_seconds: ranks_per_node keeps its default.
    if (newer_than<v1::comm_options>(options)) result.ranks_per_node = options->ranks_per_node;
  }
  return result;
}

// Wraps a communicator in a new registered handle and stores it in *out.
void publish(std::shared_ptr<Communicator> comm, shardopt_comm_t* out) {
  auto handle = std::make_unique<shardopt_comm_s>();
  handle->magic = kCommMagic;
  handle->comm = std::move(comm);
  register_handle(handle.get(), kCommMagic);
  *out = handle.release();
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;
using shardopt::Communicator;

extern "C" {

shardopt_status shardopt_comm_world(const shardopt_comm_options* options, shardopt_comm_t* out) {
  return guard("shardopt_comm_world", [&] {
    check_not_null(out, "out");
    *out = nullptr;
    publish(shardopt::mpi_world(comm_options_from(options)), out);
  });
}

shardopt_status shardopt_comm_borrow(const void* mpi_comm, const shardopt_comm_options* options,
                                     shardopt_comm_t* out) {
  return guard("shardopt_comm_borrow", [&] {
    check_not_null(out, "out");
    *out = nullptr;
    check_not_null(mpi_comm, "mpi_comm");
    publish(shardopt::mpi_borrow(mpi_comm, comm_options_from(options)), out);
  });
}

shardopt_status shardopt_comm_split(shardopt_comm_t comm, int color, int key, shardopt_comm_t* out) {
  return guard("shardopt_comm_split", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    check_not_null(out, "out");
    *out = nullptr;
    std::shared_ptr<Communicator> child = c.comm->split(color, key);
    // A negative colour joins no group (MPI_UNDEFINED): *out stays NULL, which every other call
    // refuses by name, rather than a handle over no communicator.
    if (child != nullptr) publish(std::move(child), out);
  });
}

shardopt_status shardopt_comm_destroy(shardopt_comm_t comm) {
  return guard("shardopt_comm_destroy", [&] {
    if (comm == nullptr) return;
    checked_comm(comm, "comm");
    unregister_handle(comm);
    comm->magic = 0;
    delete comm;
  });
}

shardopt_status shardopt_comm_rank(shardopt_comm_t comm, int* out) {
  return guard("shardopt_comm_rank", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    check_not_null(out, "out");
    *out = c.comm->rank();
  });
}

shardopt_status shardopt_comm_size(shardopt_comm_t comm, int* out) {
  return guard("shardopt_comm_size", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    check_not_null(out, "out");
    *out = c.comm->size();
  });
}

shardopt_status shardopt_comm_barrier(shardopt_comm_t comm) {
  return guard("shardopt_comm_barrier", [&] { checked_comm(comm, "comm").comm->barrier(); });
}

shardopt_status shardopt_comm_nccl(const void* mpi_comm, const shardopt_comm_options* options, void* stream,
                                   shardopt_comm_t* out) {
  return guard("shardopt_comm_nccl", [&] {
    check_not_null(out, "out");
    *out = nullptr;
    const shardopt::CommOptions o = comm_options_from(options);
    publish(mpi_comm == nullptr ? shardopt::nccl_world(o, stream) : shardopt::nccl_borrow(mpi_comm, o, stream), out);
  });
}

}  // extern "C"
