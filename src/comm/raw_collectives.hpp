// src/comm/raw_collectives.hpp — collectives over plain structs and byte strings, carried bit for bit as DType::byte.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/abandoned_memory.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// After a collective on `buffer` failed: one that timed out stays live in MPI and may still
// write it when the late peer arrives, so its memory is freed only once that cannot happen
// (core/abandoned_memory.hpp); at once otherwise.
template <typename T>
void free_when_untouched(std::vector<T>&& buffer) {
  auto kept = std::make_shared<std::vector<T>>(std::move(buffer));  // moving keeps the memory
  core::AbandonedMemory::process().free_or_defer(kept->data(), kept->size() * sizeof(T),
                                                 [kept]() mutable { kept.reset(); });
}

// Every rank's `mine`, in rank order. Records have one fixed size on every rank, so ranks in
// different situations (one failed, one did not) still issue the same collective.
template <typename Record>
std::vector<Record> all_gather_records(Communicator& comm, const Record& mine) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = mine;
  try {
    comm.all_gather(&all[static_cast<std::size_t>(comm.rank())], all.data(),
                    static_cast<int64_t>(sizeof(Record)), DType::byte);
  } catch (...) {
    free_when_untouched(std::move(all));
    throw;
  }
  return all;
}

// `record` as `root` has it, on every rank. Through memory of its own: `record` may be on the
// caller's stack, which a collective that timed out could still write after the caller returned.
template <typename Record>
void broadcast_record(Communicator& comm, Record& record, int root) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  std::vector<Record> staged(1, record);
  try {
    comm.broadcast(staged.data(), static_cast<int64_t>(sizeof(Record)), DType::byte, root);
  } catch (...) {
    free_when_untouched(std::move(staged));
    throw;
  }
  record = staged[0];
}

// `bytes` bytes at `data` as `root` has them, on every rank (every rank passes the same size).
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
