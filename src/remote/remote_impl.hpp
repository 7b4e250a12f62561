// src/remote/remote_impl.hpp — RemoteOptimizer's internals, shared by the facade and its checkpoints.
#pragma once

#include <mpi.h>

#include <memory>

#include "core/check.hpp"
#include "remote/service.hpp"
#include "remote/trainer.hpp"
#include "shardopt/remote.hpp"

namespace shardopt {

struct RemoteOptimizer::Impl {
  std::shared_ptr<Communicator> comm;
  RemoteOptions options;
  MPI_Comm remote_comm = MPI_COMM_NULL;  // our duplicate: requests never match the collectives
  remote::Directory directory;
  std::unique_ptr<remote::OwnerStore> store;
  std::unique_ptr<remote::Service> service;
  std::unique_ptr<remote::Trainer> trainer;
  bool closed = false;

  remote::Trainer& trainer_or_throw(const char* call) const {
    SHARDOPT_CHECK(trainer != nullptr, invalid_argument,
                   "RemoteOptimizer::{}: rank {} was constructed with RemoteOptions.trainer = false", call, comm->rank());
    return *trainer;
  }
};

}  // namespace shardopt
