// tools/demo/train.hpp — one shardopt-demo training run (sharded or replicated) and what it reports.
#pragma once

#include <cstdint>
#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

struct ModeResult {
  int64_t params = 0;
  int stage = 1;
  int64_t state_bytes = 0;  // optimizer state plus fp32 masters: all it keeps beyond params/grads
  int64_t grad_bytes = 0;   // gradient memory shardopt owns
  double peak_rss_mb = 0.0;
  double step_ms_median = 0.0;
  double params_sum = 0.0;
};

// Builds the MLP's parameters in a ZeroOptimizer (state sharded over the ranks or replicated),
// optionally resumes from --resume, runs --steps forward/backward/step iterations, optionally
// saves to --save, checks that every rank holds the same parameters and returns the numbers
// rank 0 prints. --verbose lines (per-step loss, memory report) are printed here on rank 0.
ModeResult train(const std::shared_ptr<shardopt::Communicator>& comm_ptr, const Options& options,
                 bool shard_state);

}  // namespace shardopt_demo
