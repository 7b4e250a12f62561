// tools/bench/step_bench.cpp — times ZeroOptimizer::step() between barriers, sets it against the measured roofline, checks the result against every rank and a single-rank reference.
#include "step_bench.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <fmt/format.h>

#include "bench_model.hpp"
#include "bench_support.hpp"
#include "stream_roofline.hpp"

namespace shardopt_bench {

using shardopt::OptimizerConfig;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

namespace {

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// Times `body` (a collective step of every rank) `iters` times after `warmup` untimed calls,
// each between barriers; returns the median of the slowest rank's seconds. `prepare` runs
// untimed before every call (warmup ones included).
template <typename Body, typename Prepare>
double time_collectively(Communicator& comm, int warmup, int iters, const Body& body, const Prepare& prepare) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    body();
  }
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    prepare();
    comm.barrier();
    const auto start = Clock::now();
    body();
    seconds.push_back(seconds_since(start));
    comm.barrier();
  }
  return median(slowest_rank(comm, seconds));
}

template <typename Body>
double time_collectively(Communicator& comm, int warmup, int iters, const Body& body) {
  return time_collectively(comm, warmup, iters, body, [] {});
}

// Parameters of this rank that differ bitwise from a single-rank optimizer that took the
// same `steps` steps. Each rank checks its own 1/N slice of the model: the update rules are
// elementwise and step counts agree, so a slice is a faithful reference, and the N ranks
// together cover every element at 1/N of the cost. Together with the cross-rank checksum,
// this covers every parameter on every rank.
int64_t wrong_vs_reference(const std::shared_ptr<Communicator>& solo, const Options& o, const Model& model,
                           const ZeroOptimizer& opt, int rank, int world, int steps) {
  const int64_t lo = model.numel * rank / world, hi = model.numel * (rank + 1) / world;
  const std::vector<Tensor> pieces = model_slice(model, lo, hi);
  if (pieces.empty()) return 0;
  OptimizerConfig config = make_config(o);
  config.storage = Storage::bucket_view;
  config.partition = PartitionStrategy::flat;
  config.shard_state = true;
  config.stage = 1;  // the gradients stand as written: what a stage-2 reduce of them averages to
  ExternalBuffers unused;
  std::unique_ptr<ZeroOptimizer> reference = build_optimizer(solo, o, config, pieces, unused);
  for (int s = 0; s < steps; ++s) reference->step();
  int64_t wrong = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& piece = pieces[i];
    // The model tensor this piece came from, and where the piece starts inside it.
    std::size_t owner = 0;
    while (model.tensors[owner].offset + model.tensors[owner].numel <= piece.offset) ++owner;
    const int64_t inside = piece.offset - model.tensors[owner].offset;
    const TensorRef got = opt.param_view(static_cast<shardopt::ParamId>(owner));
    const TensorRef want = reference->param_view(static_cast<shardopt::ParamId>(i));
    const auto count = [&](const auto* g, const auto* w) {
      for (int64_t k = 0; k < piece.numel; ++k) wrong += g[inside + k] != w[k] ? 1 : 0;
    };
    if (o.dtype == DType::f32) count(got.as<const uint32_t>(), want.as<const uint32_t>());
    else count(got.as<const uint16_t>(), want.as<const uint16_t>());
  }
  return wrong;
}

}  // namespace

int run_step(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const int world = comm->size();
  const int rank = comm->rank();
  const Model model = make_model(o);
  const OptimizerConfig config = make_config(o);
  const bool sharded = o.sharded && world > 1;
  // The process before the model exists (MPI, libraries), to set peak RSS against.
  const int64_t base_rss = max_int64(*comm, peak_rss_bytes());

  ExternalBuffers external;
  std::unique_ptr<ZeroOptimizer> opt = build_optimizer(comm, o, config, model.tensors, external);

  // Stage 2: the gradients reach the owners through a reduce round before every step (untimed).
  std::vector<float> grad_scratch;
  const auto prepare = [&] {
    if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
  };
  const double step_s = time_collectively(*comm, o.warmup, o.iters, [&] { opt->step(); }, prepare);
  const shardopt::MemoryReport memory = opt->memory_report();
  // Read now: the high-water mark of the optimizer alone, before STREAM's arrays and the
  // reference exist.
  const int64_t peak_rss = max_int64(*comm, peak_rss_bytes());

  // Bytes the step must move (see step_bench.hpp), summed over the ranks.
  const std::vector<int64_t> shards = gather_int64(*comm, memory.shard_numel);
  int64_t all_shards = 0;
  for (int64_t s : shards) all_shards += s;
  const UpdateShape shape = update_shape(o);
  const int64_t per_param = update_bytes_per_param(shape, o.dtype);
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  // Elements this rank updates: its shard less the flat partition's tail padding, which no
  // kernel touches (sorted_greedy and replicated shards have none).
  int64_t my_offset = 0;
  for (int r = 0; r < rank; ++r) my_offset += shards[static_cast<std::size_t>(r)];
  const int64_t my_updated =
      o.sharded && o.partition == PartitionStrategy::flat
          ? std::clamp<int64_t>(memory.trainable_numel - my_offset, 0, memory.shard_numel)
          : memory.shard_numel;
  // The all-gather moves the padding too, so received elements include it.
  const int64_t my_received = sharded ? all_shards - memory.shard_numel : 0;
  const int64_t update_bytes = sum_int64(*comm, my_updated * per_param);
  // Each received element read once and written once, in the dtype.
  const int64_t sync_bytes = sum_int64(*comm, 2 * element_bytes * my_received);
  const int64_t total_bytes = update_bytes + sync_bytes;
  const int64_t max_state = max_int64(*comm, memory.state_bytes);
  const int64_t max_master = max_int64(*comm, memory.master_bytes);
  const int64_t max_grad = max_int64(*comm, memory.grad_bytes);

  // The roofline: the update's bytes at the bandwidth of its own access pattern, the sync's
  // bytes at copy bandwidth (both summed over ranks, measured with every rank streaming).
  const StreamResult stream = measure_stream(*comm, o.threads, o.stream_mb, shape, o.dtype);
  auto roofline_seconds = [&](int64_t update, int64_t sync) {
    return static_cast<double>(update) / (stream.update_gbps * 1e9) +
           static_cast<double>(sync) / (stream.copy_gbps * 1e9);
  };
  auto gbps = [](int64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0; };
  auto fraction = [](double roofline_s, double s) { return s > 0 ? roofline_s / s : 0.0; };
  const double roofline_s = roofline_seconds(update_bytes, sync_bytes);

  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    uint64_t hash = 0xCBF29CE484222325ull;
    for (int id = 0; id < opt->num_params(); ++id) {
      const TensorRef p = opt->param_view(id);
      hash = fnv1a(p.data, p.nbytes(), hash);
    }
    const std::vector<int64_t> hashes = gather_int64(*comm, static_cast<int64_t>(hash));
    int64_t differing_ranks = 0;
    for (int64_t h : hashes) differing_ranks += h != hashes[0] ? 1 : 0;
    // Every rank gets its own single-rank communicator for the reference.
    std::shared_ptr<Communicator> solo = comm->split(rank, 0);
    const int64_t mine = wrong_vs_reference(solo, o, model, *opt, rank, world, o.warmup + o.iters);
    wrong_total = differing_ranks + sum_int64(*comm, mine);
    wrong = std::to_string(wrong_total);
  }

  const char* mode = o.sharded ? "sharded" : "replicated";
  say(*comm,
      "world={} params={} {} optimizer={} partition={} dtype={} stage={} storage={} threads={} bucket_bytes={} pipeline_chunk_bytes={} mode={} "
      "iters={} warmup={} shard_numel_max={} state_bytes_per_rank={} master_bytes_per_rank={} "
      "grad_bytes_per_rank={} peak_rss_mb={:.1f} base_rss_mb={:.1f} "
      "update_bytes={} sync_bytes={} stream_copy_gbps={:.2f} stream_triad_gbps={:.2f} "
      "stream_update_gbps={:.2f} stream_array_mb={} roofline_ms={:.3f} "
      "step_ms_median={:.3f} params_per_s={:.4g} achieved_gbps={:.2f} roofline_fraction={:.3f} wrong={}\n",
      world, model.numel, model.description, shardopt::algorithm_name(o.algorithm),
      shardopt::partition_name(o.partition), shardopt::dtype_name(o.dtype), config.stage,
      o.storage == Storage::bucket_view ? "bucket_view" : "external",
      effective_threads(o.threads), o.bucket_bytes, o.pipeline_chunk_bytes, mode, o.iters, o.warmup, *std::max_element(shards.begin(), shards.end()),
      max_state, max_master, max_grad, static_cast<double>(peak_rss) / (1 << 20), static_cast<double>(base_rss) / (1 << 20), update_bytes, sync_bytes, stream.copy_gbps,
      stream.triad_gbps, stream.update_gbps, stream.array_bytes >> 20, roofline_s * 1e3, step_s * 1e3,
      step_s > 0 ? static_cast<double>(model.numel) / step_s : 0.0, gbps(total_bytes, step_s),
      fraction(roofline_s, step_s), wrong);

  if (o.breakdown) {
    // The update alone: a single-rank optimizer over as many elements as this rank's shard,
    // every rank at once (they share the memory bus as in the real step).
    std::shared_ptr<Communicator> solo = comm->split(rank, 0);
    OptimizerConfig update_config = config;
    update_config.storage = Storage::bucket_view;
    update_config.partition = PartitionStrategy::flat;
    update_config.shard_state = true;
    update_config.stage = 1;  // gradients written in place; the update itself is the same
    ExternalBuffers unused;
    std::unique_ptr<ZeroOptimizer> update_only;
    if (my_updated > 0) update_only = build_optimizer(solo, o, update_config, model_slice(model, 0, my_updated), unused);
    const double update_s = time_collectively(*comm, o.warmup, o.iters, [&] {
      if (update_only) update_only->step();
    });
    update_only.reset();

    // The sync alone, issued as the optimizer issues it.
    double sync_s = 0;
    if (sharded) {
      // Parameters in the dtype (bf16/f16: the 16-bit params, as the optimizer gathers them).
      std::vector<char> buffer(static_cast<std::size_t>(all_shards * element_bytes), 0);
      const auto at = [&](int64_t element) { return buffer.data() + element * element_bytes; };
      std::vector<int64_t> shard_offset(shards.size(), 0);
      for (std::size_t r = 1; r < shards.size(); ++r) shard_offset[r] = shard_offset[r - 1] + shards[r - 1];
      const int64_t bucket = config.bucket_bytes / element_bytes;
      sync_s = time_collectively(*comm, o.warmup, o.iters, [&] {
        if (o.partition == PartitionStrategy::flat) {
          const int64_t c = memory.shard_numel;
          comm->all_gather(at(static_cast<int64_t>(rank) * c), buffer.data(), c, o.dtype);
          return;
        }
        std::vector<std::unique_ptr<shardopt::PendingCollective>> pending;
        for (int r = 0; r < world; ++r) {
          const auto ru = static_cast<std::size_t>(r);
          for (int64_t begin = 0; begin < shards[ru]; begin += bucket) {
            pending.push_back(comm->broadcast_async(at(shard_offset[ru] + begin),
                                                    std::min(bucket, shards[ru] - begin), o.dtype, r));
          }
        }
        for (auto& p : pending) p->wait();
      });
    }
    // The gradient average before a step (not part of step_ms): reduce_gradients() over the
    // same synthetic gradients, whose coarse values average to themselves. Stage 2 hands them.
    const double reduce_s = time_collectively(*comm, o.warmup, o.iters, [&] {
      if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
      else opt->reduce_gradients();
    });
    say(*comm,
        "breakdown: update_ms_median={:.3f} update_gbps={:.2f} update_roofline_fraction={:.3f} "
        "sync_ms_median={:.3f} sync_gbps={:.2f} sync_roofline_fraction={:.3f} rest_ms={:.3f} "
        "reduce_gradients_ms_median={:.3f}\n",
        update_s * 1e3, gbps(update_bytes, update_s), fraction(roofline_seconds(update_bytes, 0), update_s),
        sync_s * 1e3, gbps(sync_bytes, sync_s), fraction(roofline_seconds(0, sync_bytes), sync_s),
        (step_s - update_s - sync_s) * 1e3, reduce_s * 1e3);
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace shardopt_bench
