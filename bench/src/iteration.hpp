// bench/src/iteration.hpp — the whole training iteration's optimizer work, reduce_gradients() then step(), each timed against its roofline from bandwidth probes interleaved with the timed iterations (--mode iteration).
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// One ZeroOptimizer over make_model's model (as --mode step). -w untimed iterations, then -n
// timed ones, each preceded by a bandwidth probe (stream.hpp, 2 repetitions of each pattern):
//
//   probe; barrier; t0; reduce; t1; barrier; t2; step(); t3; barrier
//
// where reduce is reduce_gradients() (stage 1, over the gradient views) or, at stage 2, every
// gradient handed with reduce_gradient() and reduce_gradients() (the copy into the staging is
// part of what a stage-2 user pays). Medians over the iterations of the slowest rank's times.
//
// The rooflines (step_bytes.hpp): the step's update + sync bytes, and the reduction's floor on
// one node, at the best bandwidth any probe reached (roofline_fraction, as --mode step), and
// each iteration against the probe just before it (paired_fraction: the median over the
// iterations). The probes' spread (best / worst) says how much the machine's bandwidth moved
// during the run: a fraction outside 0.8-1.05 with a small spread is the code, not the machine.
//
// Prints one key=value line on rank 0; exit status as --mode step (1 wrong parameters, 3 a
// fraction that is a measurement error, else 0).
int run_iteration(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o);

}  // namespace shardopt_bench
