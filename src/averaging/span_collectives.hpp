// src/averaging/span_collectives.hpp — collectives over lists of host spans (the averaged shard values, warmup's gradients).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace averaging {

struct HostSpan {
  void* data = nullptr;
  int64_t count = 0;
};

// Collective over `comm`: an all-reduce of the concatenation of `spans` (elements of `dtype`),
// in collectives of at most `bucket_elements`. Adjacent spans merge; a bucket that is one
// piece of memory is reduced in place, others through a staging copy. `prepare(data, n)` runs
// on each bucket's elements just before its collective (torch's divide-before-sum). Returns
// the bytes handed to collectives (0 when `comm` has one rank: nothing is done).
int64_t all_reduce_spans(Communicator& comm, std::vector<HostSpan> spans, DType dtype, int64_t bucket_elements,
                         ReduceOp op, const std::function<void(void*, int64_t)>& prepare = {});

}  // namespace averaging
}  // namespace shardopt
