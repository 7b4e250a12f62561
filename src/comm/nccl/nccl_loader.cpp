// src/comm/nccl/nccl_loader.cpp — dlopen of libnccl.so.2, the table of the NCCL functions shardopt uses, and the forwarders that stand in for them.
#include "comm/nccl/nccl_loader.hpp"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>
#include <string>

#include "core/check.hpp"

namespace shardopt {
namespace comm {
namespace {

// NCCL's soname: the ABI shardopt is compiled against (nccl.h of NCCL 2.x). The environment
// variable SHARDOPT_NCCL_LIBRARY names another file (a path, e.g. the libnccl.so.2 of a pip
// package, or another name for the loader to search).
constexpr const char* kNcclLibrary = "libnccl.so.2";

std::string nccl_library_name() {
  const char* chosen = std::getenv("SHARDOPT_NCCL_LIBRARY");
  return chosen != nullptr && *chosen != '\0' ? chosen : kNcclLibrary;
}

// The NCCL functions shardopt calls, with nccl.h's own types.
struct NcclTable {
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&::ncclCommSplit) comm_split = nullptr;
  decltype(&::ncclCommFinalize) comm_finalize = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclCommCount) comm_count = nullptr;
  decltype(&::ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
};

struct Loaded {
  NcclTable table;
  std::string failure;  // "" once every function is resolved
};

// Opens the library and fills the table; `failure` says why not. The handle is never closed:
// NCCL's threads and communicators live until the process exits.
Loaded load() {
  Loaded loaded;
  const std::string library = nccl_library_name();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    loaded.failure = fmt::format("{} (install NCCL 2.18 or newer, put the directory holding {} on "
                                 "LD_LIBRARY_PATH, or name the file in SHARDOPT_NCCL_LIBRARY)",
                                 why != nullptr ? why : library, kNcclLibrary);
    return loaded;
  }
  const auto resolve = [&](auto& slot, const char* name) {
    if (!loaded.failure.empty()) return;
    void* symbol = dlsym(handle, name);
    if (symbol == nullptr) {
      loaded.failure = fmt::format("{} has no {} (shardopt needs NCCL 2.18 or newer)", library, name);
      return;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  NcclTable& t = loaded.table;
  resolve(t.get_unique_id, "ncclGetUniqueId");
  resolve(t.comm_init_rank_config, "ncclCommInitRankConfig");
  resolve(t.comm_split, "ncclCommSplit");
  resolve(t.comm_finalize, "ncclCommFinalize");
  resolve(t.comm_destroy, "ncclCommDestroy");
  resolve(t.comm_abort, "ncclCommAbort");
  resolve(t.comm_get_async_error, "ncclCommGetAsyncError");
  resolve(t.comm_count, "ncclCommCount");
  resolve(t.comm_user_rank, "ncclCommUserRank");
  resolve(t.get_error_string, "ncclGetErrorString");
  resolve(t.get_last_error, "ncclGetLastError");
  resolve(t.all_reduce, "ncclAllReduce");
  resolve(t.broadcast, "ncclBroadcast");
  resolve(t.all_gather, "ncclAllGather");
  resolve(t.reduce_scatter, "ncclReduceScatter");
  resolve(t.reduce, "ncclReduce");
  resolve(t.group_start, "ncclGroupStart");
  resolve(t.group_end, "ncclGroupEnd");
  if (!loaded.failure.empty()) loaded.table = NcclTable{};  // all or nothing
  return loaded;
}

const Loaded& loaded_nccl() {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

// The table for the forwarders. Only reached after require_nccl_library succeeded (every NCCL
// call follows a communicator's creation), so the pointers are set.
const NcclTable& nccl() { return loaded_nccl().table; }

}  // namespace

void require_nccl_library(const char* who) {
  const Loaded& loaded = loaded_nccl();
  if (!loaded.failure.empty()) {
    raise(ErrorCode::unsupported, "{}: NCCL cannot be loaded: {}", who, loaded.failure);
  }
}

}  // namespace comm
}  // namespace shardopt

// The forwarders: nccl.h's declarations (extern "C"), defined here and hidden inside
// libshardopt (default hidden visibility and the export map), so that the NCCL code calls NCCL
// unchanged and a process that loads its own NCCL (torch) keeps its own symbols.
using shardopt::comm::nccl;

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { return nccl().get_unique_id(id); }
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  return nccl().comm_init_rank_config(comm, nranks, id, rank, config);
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child, ncclConfig_t* config) {
  return nccl().comm_split(comm, color, key, child, config);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return nccl().comm_finalize(comm); }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return nccl().comm_destroy(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return nccl().comm_abort(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  return nccl().comm_get_async_error(comm, state);
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { return nccl().comm_count(comm, count); }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) { return nccl().comm_user_rank(comm, rank); }
const char* ncclGetErrorString(ncclResult_t result) { return nccl().get_error_string(result); }
const char* ncclGetLastError(ncclComm_t comm) { return nccl().get_last_error(comm); }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return nccl().all_reduce(send, recv, count, type, op, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return nccl().broadcast(send, recv, count, type, root, comm, stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return nccl().all_gather(send, recv, count, type, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return nccl().reduce_scatter(send, recv, count, type, op, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return nccl().reduce(send, recv, count, type, op, root, comm, stream);
}
ncclResult_t ncclGroupStart() { return nccl().group_start(); }
ncclResult_t ncclGroupEnd() { return nccl().group_end(); }
