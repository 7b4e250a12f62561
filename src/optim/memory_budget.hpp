// src/optim/memory_budget.hpp — the host memory a registration's buffers will take on this rank, and the buckets they are cut into, refused up front when too many.
//
// An allocation that fails inside a layout rebuild fails on one rank, after the agreement, where
// the others are already in the rebuild's collectives. So the bytes are counted before, inside
// the agreement: a registration that could never fit is Error(out_of_memory) on every rank.
#pragma once

#include <cstdint>

#include "optim/param_table.hpp"

namespace shardopt {
namespace optim {

// Bytes of the host buffers this rank allocates for its parameters, gradients and state.
struct MemoryBudget {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t state = 0;
  int64_t total() const { return params + grads + state; }
};

// What `table` plus `added` will allocate on `rank` of `world` (the layout itself is checked on
// the way: Error(invalid_argument) when it cannot be laid out).
MemoryBudget registration_budget(const OptimizerConfig& config, const ParamTable& table, const Registration& added,
                                 int rank, int world);

// Error(invalid_argument) naming config.bucket_bytes when the buffer of `table` plus `added`,
// with every parameter trainable (what set_trainable may come to), would be cut into more than
// kMaxBuckets buckets; checked before the memory, since such a model may also not fit.
void check_bucket_count(const OptimizerConfig& config, const ParamTable& table, const Registration& added, int world);

// The machine's physical memory plus swap, in bytes (0 when it cannot be told).
int64_t host_memory_bytes();

// Error(out_of_memory) naming the bytes of each part when `budget` exceeds `available` bytes.
void check_budget(const MemoryBudget& budget, int64_t available, int rank);

}  // namespace optim
}  // namespace shardopt
