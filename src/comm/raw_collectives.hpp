// src/comm/raw_collectives.hpp — collectives over plain structs, carried bit for bit as 16-bit words.
#pragma once

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
  static_assert(sizeof(Record) % 2 == 0, "records travel as 16-bit words");
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = mine;
  // bf16 is only a 16-bit carrier here: a gather moves bits without arithmetic.
  comm.all_gather(&all[static_cast<std::size_t>(comm.rank())], all.data(),
                  static_cast<int64_t>(sizeof(Record) / 2), DType::bf16);
  return all;
}

}  // namespace comm
}  // namespace shardopt
