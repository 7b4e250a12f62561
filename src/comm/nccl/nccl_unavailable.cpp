// src/comm/nccl/nccl_unavailable.cpp — the NCCL factories of a build without NCCL: they say so instead of failing to link.
#include "core/check.hpp"
#include "shardopt/nccl.hpp"

namespace shardopt {

bool nccl_compiled_in() { return false; }

std::shared_ptr<Communicator> nccl_world(const CommOptions&, void*) {
  raise(ErrorCode::unsupported,
        "nccl_world: this build of shardopt has no NCCL backend (configure with "
        "SHARDOPT_WITH_NCCL=ON where CUDA and NCCL are installed)");
}

std::shared_ptr<Communicator> nccl_borrow(const void*, const CommOptions&, void*) {
  raise(ErrorCode::unsupported,
        "nccl_borrow: this build of shardopt has no NCCL backend (configure with "
        "SHARDOPT_WITH_NCCL=ON where CUDA and NCCL are installed)");
}

void* nccl_stream(const Communicator& comm) {
  raise(ErrorCode::invalid_argument,
        "nccl_stream: the communicator is a '{}' communicator, and this build has no NCCL backend",
        comm.backend_name());
}

}  // namespace shardopt
