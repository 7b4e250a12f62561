// src/averaging/shard_values.hpp — the f32 values that make up this rank's shard of a replica (params, or fp32 masters of 16-bit params), and collectives over lists of host spans.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "optim/shard_state.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace averaging {

// A piece of this rank's shard: `count` f32 values at `data`, at `shard_offset` in the shard.
struct ValueSpan {
  float* data = nullptr;
  int64_t count = 0;
  int64_t shard_offset = 0;
};

// The trainable values this rank updates, segment by segment: the parameters themselves (f32)
// or their fp32 masters (bf16/f16), the values the next update starts from.
std::vector<ValueSpan> shard_value_spans(const optim::ShardState& shard);
// After the values changed: 16-bit parameters take their masters rounded to nearest even.
// (The replica's parameter sync then spreads the shard.)
void publish_shard_values(const optim::ShardState& shard, int threads);

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
