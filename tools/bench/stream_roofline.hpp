// tools/bench/stream_roofline.hpp — memory bandwidths measured in the same run (STREAM copy and triad, and the update rule's own access pattern) for the step's roofline.
#pragma once

#include <cstdint>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

struct StreamResult {
  // GB/s summed over ranks, all streaming at once.
  double copy_gbps = 0;
  double triad_gbps = 0;
  double update_gbps = 0;  // the update's own access pattern (see measure_stream)
  int64_t array_bytes = 0;  // per array per rank
};

// The update rule's memory access pattern with trivial arithmetic: the same streams, read
// and written, as the step's kernel, so the roofline is what this pattern can move.
enum class UpdateShape { adam, sgd_momentum, sgd };
UpdateShape update_shape(const Options& o);

// Explicit loads + stores of the update rule per updated element (see step_bench.hpp).
// f32: read p and g, write p (12) plus the state; bf16/f16: read g and write p in the dtype,
// read and write the fp32 master (8) plus the state. The state is fp32 r/w: 16 (Adam's m and
// v), 8 (SGD's momentum buffer) or 0.
int64_t update_bytes_per_param(UpdateShape shape, DType dtype);

// STREAM's copy (c = a, 8 B/element) and triad (a = b + s*c, 12 B/element), and a kernel
// shaped like the update (adam: p, g, m, v read and p, m, v written, 28 B/element), over
// arrays far larger than the last-level cache, with the step's threads per rank and every
// rank at once. Each repetition starts on a barrier and lasts as long as its slowest rank;
// the best repetition counts, as in STREAM.
//
// Why the third kernel: one core's bandwidth is bounded by how many cache misses it keeps in
// flight, which grows with the number of streams. On the 2-core VM these numbers come from,
// copy (2 streams) reaches ~4.7 GB/s, triad (3) ~5.5 and the 7-stream Adam shape ~9 GB/s, so
// triad alone would put a well-vectorised Adam step far above "100% of the roofline".
//
// bf16/f16: the update-shaped kernel reads a 16-bit gradient, the master, m and v and writes
// the master, m, v and a 16-bit parameter (9 streams for Adam), two extra 16-bit arrays of the
// same length; copy and triad stay f32 (a copy's GB/s do not depend on the element type).
StreamResult measure_stream(shardopt::Communicator& comm, int threads, int64_t array_mb, UpdateShape shape,
                            DType dtype);

}  // namespace shardopt_bench
