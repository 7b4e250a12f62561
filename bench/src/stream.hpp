// bench/src/stream.hpp — memory bandwidths measured in the same run (STREAM copy and triad, and the update rule's own access pattern) for the step's roofline.
#pragma once

#include <cstdint>

#include "roofline.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

struct StreamResult {
  // GB/s summed over ranks, all streaming at once.
  double copy_gbps = 0;
  double triad_gbps = 0;
  double update_gbps = 0;  // the update's own access pattern (see measure_stream)
  int64_t array_bytes = 0;  // per array per rank

  // The roofline: the best any pattern reached, and which one.
  double best_gbps() const;
  const char* best_pattern() const;  // "copy", "triad" or "update"
};

// STREAM's copy (c = a, 8 B/element) and triad (a = b + s*c, 12 B/element), and a kernel
// shaped like the update (adam: p, g, m, v read and p, m, v written, 28 B/element), each run by
// kernels/cpu/stream_cpu (compiled and dispatched like the update kernels), over `array_bytes`
// per array per rank (see stream_array_bytes in cache.hpp), with the step's threads per rank
// and every rank at once. Each repetition starts on a barrier and lasts as long as its slowest
// rank; the best repetition after a warm-up one counts, as in STREAM.
//
// Why the third kernel: one core's bandwidth is bounded by how many cache misses it keeps in
// flight, which grows with the number of streams, so on a core that is latency-bound the
// 7-stream Adam shape moves more bytes per second than copy (2 streams) or triad (3). The
// roofline takes the best of the three, so whichever shape the machine favours, the step is
// held to it.
//
// bf16/f16: the update-shaped kernel reads a 16-bit gradient, the master, m and v and writes
// the master, m, v and a 16-bit parameter (9 streams for Adam), two extra 16-bit arrays of the
// same length; copy and triad stay f32 (a copy's GB/s do not depend on the element type).
// `reps` repetitions of each (at least 2: the first is the warm-up).
StreamResult measure_stream(shardopt::Communicator& comm, int threads, int64_t array_bytes, UpdateShape shape,
                            DType dtype, int reps = 6);

}  // namespace shardopt_bench
