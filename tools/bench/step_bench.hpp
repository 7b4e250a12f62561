// tools/bench/step_bench.hpp — the full optimizer step timed against a memory roofline measured in the same run (--mode step).
#pragma once

#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// What the step "must move", per rank r (printed summed over ranks):
//
//   update_bytes  (elements rank r updates) x bytes_per_param: the explicit loads and stores
//                 of the update rule over rank r's shard (replicated: every element; the
//                 flat partition's tail padding is not updated and not counted):
//                   f32:
//                   adam/adamw  28 = read p, g, m, v (16) + write p, m, v (12)
//                   sgd         20 = read p, g, buf (12) + write p, buf (8)   (momentum != 0)
//                               12 = read p, g (8) + write p (4)              (momentum == 0)
//                   bf16/f16 (mixed precision: the fp32 master is the parameter the rule
//                   updates; the 16-bit parameter is only written, rounded from it):
//                   adam/adamw  28 = read g (2) + write p (2) + master r/w (8) + m, v r/w (16)
//                   sgd         20 = read g (2) + write p (2) + master r/w (8) + buf r/w (8)
//                               12 = read g (2) + write p (2) + master r/w (8)
//                 i.e. 2 x sizeof(dtype) + 8 + state r/w: the same totals as f32, over 9
//                 streams instead of 7 (Adam).
//   sync_bytes    2 x sizeof(dtype) x (elements rank r receives): each element of another
//                 rank's shard must be read once (in the peer's memory or a transport buffer)
//                 and written once into this rank's parameter buffer, a memcpy that STREAM's
//                 copy counts as 2 x sizeof(dtype) bytes (8 for f32, 4 for bf16/f16: the
//                 all-gather moves the 16-bit parameters, never the masters). Flat partition:
//                 (N-1) x shard elements, padding included (the all-gather moves it);
//                 sorted_greedy: the other ranks' shards. Sharded runs with world > 1 only:
//                 replicated runs have no sync.
//
// --stage 2 leaves the timed step as it is (the same update and sync); it changes how the
// gradients arrive: before every step, untimed, each rank hands every gradient with
// reduce_gradient() (bucket view; external storage: its buffers) and reduce_gradients()
// reduces them to their owners. Every rank hands the same synthetic gradients, rounded to 4
// significant bits so that every partial sum of up to 16 ranks is exact in any dtype: the
// average is then exactly the gradient, whatever order MPI adds in, and the single-rank
// reference (stage 1, the same gradients) stays bitwise comparable.
//
// Not counted, because a step does not have to move them: the staging copies of external
// storage (a bucket-view step needs none), the second copy a two-copy shared-memory
// transport makes, and write-allocate reads of stored cache lines (STREAM does not count
// those either, so both sides of the ratio leave them out).
//
// The update-shaped bandwidth kernel follows the dtype: f32 reads p, g, m, v and writes p, m,
// v; bf16/f16 reads a 16-bit g, the master, m, v and writes the master, m, v and a 16-bit p.
//
//   roofline_ms        = update_bytes / stream_update_gbps + sync_bytes / stream_copy_gbps
//   achieved_gbps      = (update_bytes + sync_bytes) / step time
//   roofline_fraction  = roofline_ms / step_ms_median   (1.0 = moving bytes as fast as the
//                        measured kernels do; a DRAM roofline, so a step whose buffers fit in
//                        the last-level cache can exceed it)
//
// One ZeroOptimizer over the model of make_model, the full step() timed between barriers
// (median over -n iterations of the slowest rank), then compared with the roofline of
// measure_stream; afterwards every rank checks that it holds the same parameters as every
// other rank and as a single-rank reference optimizer that took the same steps. Prints one
// key=value line on rank 0 (and a breakdown line with --breakdown); returns the exit status
// (1 when any parameter was wrong).
int run_step(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o);

}  // namespace shardopt_bench
