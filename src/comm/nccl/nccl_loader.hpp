// src/comm/nccl/nccl_loader.hpp — NCCL loaded at run time (dlopen of libnccl.so.2), so that libshardopt loads and runs its CPU paths where NCCL is not installed.
//
// libshardopt is compiled against nccl.h but never linked to libnccl: nccl_loader.cpp defines
// the NCCL functions shardopt calls (hidden inside the library) as forwarders to the ones
// dlsym finds in libnccl.so.2, resolved once, on the first nccl_world/nccl_borrow. The rest of
// src/comm/nccl calls NCCL as usual.
#pragma once

namespace shardopt {
namespace comm {

// Loads libnccl.so.2 (or the file SHARDOPT_NCCL_LIBRARY names) and resolves every NCCL
// function shardopt uses, once per process (thread safe). Error(unsupported), naming `who` and what is missing (dlopen's own words: the library
// not found, or a function an old NCCL lacks), when that fails; every later call says the same.
void require_nccl_library(const char* who);

}  // namespace comm
}  // namespace shardopt
