// bench/src/step.hpp — the full optimizer step timed against a memory roofline measured in the same run (--mode step).
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// One ZeroOptimizer over the model of make_model; -w untimed steps, then -n steps each timed
// as `barrier; t0; step(); t1; barrier`. The step's time is the median over the steps of the
// slowest rank's; its phases (ZeroOptimizer::last_step(): agreement, update, sync) are read
// after every timed step, and each is reported as the median over the steps of that step's
// slowest rank's phase, with rest = step - (agree + update + sync) taken per step, never
// negative because the bench's timer encloses the library's.
//
// Then the roofline (roofline.hpp: the bytes the step must move at the best bandwidth that
// stream.hpp measured) and its verdict, and the self-check of verify.hpp.
//
// --stage 2 leaves the timed step as it is (the same update and sync); it changes how the
// gradients arrive: before every step, untimed, each rank hands every gradient with
// reduce_gradient() (bucket view; external storage: its buffers) and reduce_gradients()
// reduces them to their owners. Every rank hands the same synthetic gradients, rounded to 4
// significant bits so that every partial sum of up to 16 ranks is exact in any dtype: the
// average is then exactly the gradient, whatever order MPI adds in, and the single-rank
// reference (stage 1, the same gradients) stays bitwise comparable.
//
// Prints one key=value line on rank 0 (and the breakdown line with --breakdown); returns the
// exit status: 1 when any parameter was wrong, else 3 when a roofline fraction was a
// measurement error (roofline.hpp), else 0.
int run_step(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o);

}  // namespace shardopt_bench
