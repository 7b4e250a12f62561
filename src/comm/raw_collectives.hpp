// src/comm/raw_collectives.hpp — collectives over plain structs and byte strings, carried bit for bit as DType::byte.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// Every rank's `mine`, in rank order. Records have one fixed size on every rank, so ranks in
// different situations (one failed, one did not) still issue the same collective.
template <typename Record>
std::vector<Record> all_gather_records(Communicator& comm, const Record& mine) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = mine;
  comm.all_gather(&all[static_cast<std::size_t>(comm.rank())], all.data(),
                  static_cast<int64_t>(sizeof(Record)), DType::byte);
  return all;
}

// `record` as `root` has it, on every rank.
template <typename Record>
void broadcast_record(Communicator& comm, Record& record, int root) {
  static_assert(std::is_trivially_copyable<Record>::value, "records travel as raw bytes");
  comm.broadcast(&record, static_cast<int64_t>(sizeof(Record)), DType::byte, root);
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
