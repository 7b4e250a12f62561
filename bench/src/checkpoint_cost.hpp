// bench/src/checkpoint_cost.hpp — the step time a checkpoint costs: no save, a blocking save(), and save_async() with wait_save() (--mode checkpoint).
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// One ZeroOptimizer over the model of make_model (stage 1), -w untimed steps, then -n rounds
// of --save-every steps each, three kinds of round in turn:
//   plain     the steps alone;
//   blocking  save(--ckpt-dir), then the steps;
//   async     save_async(--ckpt-dir), the steps, then wait_save() (the commit: the ranks'
//             agreement, rank 0's proof reading every file, the manifest).
// Every call is timed between barriers on its slowest rank. A round's visible cost is its
// time minus --save-every plain steps (the median plain step); the line reports the medians
// over the rounds of each kind and async/blocking, the ratio of their visible costs. The first
// step after save_async() waits until the background writer has handed the state to the
// kernel; the steps after it overlap the file's fsync.
//
// Prints one key=value line on rank 0; returns 0, or 1 when a checkpoint does not resume to
// the parameters it was taken at (each kind's last one is loaded and checked).
int run_checkpoint_cost(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o);

}  // namespace shardopt_bench
