// bench/src/roofline.hpp — what the optimizer step must move, the bandwidth it is held to, and the verdict on a measured fraction of that roofline.
#pragma once

#include <cstdint>
#include <string>

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
//                 replicated runs have no sync. Node-shared parameters (bucket view, the
//                 default on CPU): one buffer per node, so nothing moves between a node's
//                 ranks and only other nodes' shards count, once per node; external storage
//                 then syncs through a node-shared staging buffer: every element copied in or
//                 out once (step.cpp, from MemoryReport::node_shared_param_bytes).
//
// Not counted, because a step does not have to move them: the staging copies of external
// storage (a bucket-view step needs none), the second copy a two-copy shared-memory
// transport makes, and write-allocate reads of stored cache lines (STREAM does not count
// those either, so both sides of the ratio leave them out).
//
// The roofline is one bandwidth, the best that any measured pattern reached (STREAM's copy and
// triad, and a kernel with the update rule's own streams: see stream.hpp), applied to both
// parts: a step cannot move bytes faster than the machine was seen to move them at all.
//
//   roofline_ms        = (update_bytes + sync_bytes) / roofline_gbps
//   achieved_gbps      = (update_bytes + sync_bytes) / step time
//   roofline_fraction  = roofline_ms / step_ms_median

// The update rule's memory access pattern: the streams it reads and writes.
enum class UpdateShape { adam, sgd_momentum, sgd };
UpdateShape update_shape(const Options& o);

// Explicit loads + stores of the update rule per updated element (above).
int64_t update_bytes_per_param(UpdateShape shape, DType dtype);

// A fraction of a DRAM roofline above this is not a result but a broken measurement: the
// bandwidths were under-measured (arrays in cache, a slower code path than the step's, a
// disturbed run) or the bytes miscounted. The margin covers run-to-run noise of the best-of
// bandwidth and the step's median.
constexpr double kRooflineTolerance = 1.05;

// A step whose data fit in the last-level caches of its machine is not bounded by DRAM
// bandwidth at all: its fraction is printed, but judged neither way. Data may fit when the
// bytes the ranks of one machine touch in a step are at most twice the most cache any source
// claims for it (cache.hpp; streamed data larger than that is evicted before the next step
// reuses it).
constexpr double kCacheResidentFactor = 2.0;

enum class RooflineStatus { ok, cache_resident, measurement_error };

struct RooflineVerdict {
  double fraction = 0;  // roofline time / measured time
  RooflineStatus status = RooflineStatus::ok;
};

RooflineVerdict judge_roofline(double roofline_seconds, double measured_seconds, bool cache_resident);

// "0.812", "1.120 (measurement error: above 1.05)", "3.100 (cache-resident: not DRAM-bound)".
std::string format_fraction(const RooflineVerdict& verdict);

const char* status_name(RooflineStatus status);  // ok, cache_resident, measurement_error

}  // namespace shardopt_bench
