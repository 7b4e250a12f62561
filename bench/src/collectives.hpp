// bench/src/collectives.hpp — the nccl-tests-style sweep of shardopt's collectives (--mode collectives).
#pragma once

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// One table per op in options.ops over the -b..-e sweep, with nccl-tests' columns: size, count,
// time, algbw, busbw, #wrong. Every timed iteration refills its inputs and checks every element
// of the result (-c 1), so a collective that moves the wrong bytes cannot look fast. Prints on
// rank 0; returns the exit status (1 when any element was wrong).
int run_collectives(shardopt::Communicator& comm, const Options& options);

// The same sweep with the collectives run on `tested` (the same ranks as `comm`, which times,
// barriers and sums the checks over MPI): with --device cuda, a NCCL or CUDA-aware communicator
// over device buffers on tested.device().
int run_collectives(shardopt::Communicator& comm, shardopt::Communicator& tested, const Options& options);

}  // namespace shardopt_bench
