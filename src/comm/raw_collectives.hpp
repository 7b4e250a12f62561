// src/comm/raw_collectives.hpp — collectives over plain structs and byte strings, carried bit for bit as DType::byte.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/abandoned_memory.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

using core::free_when_untouched;

// Runs `collective`, which reads or writes the memory of `buffer`, and returns what it returns.
// When it throws, the collective may stay live in MPI and touch that memory later, so the
// allocation goes to free_when_untouched (`buffer` is left empty) before the error goes on.
// The one way internal collectives keep their own buffers; memory on the stack must first be
// copied into such a buffer (broadcast_record).
template <typename T, typename Collective>
decltype(auto) run_keeping_on_failure(std::vector<T>& buffer, Collective&& collective) {
  try {
    return std::forward<Collective>(collective)();
  } catch (...) {
    free_when_untouched(std::move(buffer));
    throw;
  }
}

// Every rank's `mine`, in rank order. Records have one fixed size on every rank, so ranks in
// different situations (one failed, one did not) still issue the same collective.
template <typename Record>
std::vector<Record> all_gather_records(Communicator& comm, const Record& mine) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  Record* own = &all[static_cast<std::size_t>(comm.rank())];
  *own = mine;
  run_keeping_on_failure(all, [&] { comm.all_gather(own, all.data(), static_cast<int64_t>(sizeof(Record)), DType::byte); });
  return all;
}

// `record` as `root` has it, on every rank. Through memory of its own: `record` may be on the
// caller's stack, which a collective that timed out could still write after the caller returned.
template <typename Record>
void broadcast_record(Communicator& comm, Record& record, int root) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  std::vector<Record> staged(1, record);
  run_keeping_on_failure(staged, [&] {
    comm.broadcast(staged.data(), static_cast<int64_t>(sizeof(Record)), DType::byte, root);
  });
  record = staged[0];
}

// `values` as `root` has them, on every rank (every rank passes as many). On failure `values`
// is left empty: its memory is handed over (run_keeping_on_failure).
template <typename T>
void broadcast_values(Communicator& comm, std::vector<T>& values, int root) {
  static_assert(std::is_trivially_copyable<T>::value, "values travel as raw bytes");
  if (values.empty()) return;
  run_keeping_on_failure(values, [&] {
    comm.broadcast(values.data(), static_cast<int64_t>(values.size() * sizeof(T)), DType::byte, root);
  });
}

// `bytes` bytes at `data` as `root` has them, on every rank (every rank passes the same size).
// `data` must be memory that outlives a collective that fails (memory freed through
// core/abandoned_memory.hpp, as FlatBuffer's and checkpoint staging slots).
inline void broadcast_bytes(Communicator& comm, void* data, int64_t bytes, int root) {
  comm.broadcast(data, bytes, DType::byte, root);
}

// `count` elements at `data` as `root` has them, on every rank, in broadcasts of at most
// `chunk` elements each (one collective per chunk, so none exceeds a size limit).
inline void broadcast_in_chunks(Communicator& comm, void* data, int64_t count, DType dtype, int root, int64_t chunk) {
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t n = count - begin < chunk ? count - begin : chunk;
    comm.broadcast(static_cast<char*>(data) + begin * static_cast<int64_t>(dtype_size(dtype)), n, dtype, root);
  }
}

}  // namespace comm
}  // namespace shardopt
