// bench/src/step.cpp — times ZeroOptimizer::step() and its phases between barriers, sets them against the roofline measured in the same run, and reports with the self-check's result.
#include "step.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "cache.hpp"
#include "model.hpp"
#include "roofline.hpp"
#include "step_bytes.hpp"
#include "stream.hpp"
#include "support.hpp"
#include "sync_peers.hpp"
#include "verify.hpp"

namespace shardopt_bench {

using shardopt::OptimizerConfig;
using shardopt::ZeroOptimizer;

namespace {

// The process's peak resident set (VmHWM), which reset_peak_rss() can bring back down to the
// current resident set; getrusage's figure where /proc is not mounted.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// Linux: writing 5 to clear_refs resets VmHWM (since 4.0). `probe_only` checks it can be done.
bool reset_peak_rss(bool probe_only) {
  const int fd = open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0) return false;
  const bool ok = probe_only || write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

// Each pattern's best over two measurement windows.
StreamResult best_of(const StreamResult& a, const StreamResult& b) {
  StreamResult best = b;
  best.copy_gbps = std::max(a.copy_gbps, b.copy_gbps);
  best.triad_gbps = std::max(a.triad_gbps, b.triad_gbps);
  best.update_gbps = std::max(a.update_gbps, b.update_gbps);
  return best;
}

// The timed steps: medians over the steps, each step read on its slowest rank, so that the
// parts add up to the step.
struct StepTiming {
  double step_s = 0;
  double agree_s = 0;
  double update_s = 0;
  double sync_s = 0;
  double rest_s = 0;  // step - (agree + update + sync), per step
  // For bandwidths, which sum every rank's bytes: the longest rank's update and sync of each
  // step (the ranks leave the agreement together, so all of them have updated when the longest
  // has). The slowest rank's own update may be the shorter one.
  double update_longest_s = 0;
  double sync_longest_s = 0;
};

// `prepare` runs untimed before every step (warmup ones included).
template <typename Prepare>
StepTiming time_steps(Communicator& comm, ZeroOptimizer& opt, int warmup, int iters, const Prepare& prepare) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    opt.step();
  }
  // This rank's [step, agree, update, sync] of every timed step, in that order.
  constexpr std::size_t kFields = 4;
  std::vector<double> mine;
  mine.reserve(kFields * static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    prepare();
    comm.barrier();
    const auto start = Clock::now();
    opt.step();
    const double seconds = seconds_since(start);
    const shardopt::StepReport& report = opt.last_step();
    mine.insert(mine.end(), {seconds, report.agree_seconds, report.update_seconds, report.sync_seconds});
    comm.barrier();
  }
  const std::vector<double> all = all_gather_exact(comm, mine);
  const std::size_t per_rank = mine.size();
  std::vector<double> step, agree, update, sync, rest, update_longest, sync_longest;
  for (std::size_t i = 0; i < static_cast<std::size_t>(iters); ++i) {
    // The rank that finished this step last: the one a user waits for.
    const double* slowest = &all[kFields * i];
    double longest_update = 0, longest_sync = 0;
    for (int r = 0; r < comm.size(); ++r) {
      const double* row = &all[static_cast<std::size_t>(r) * per_rank + kFields * i];
      if (row[0] > slowest[0]) slowest = row;
      longest_update = std::max(longest_update, row[2]);
      longest_sync = std::max(longest_sync, row[3]);
    }
    update_longest.push_back(longest_update);
    sync_longest.push_back(longest_sync);
    step.push_back(slowest[0]);
    agree.push_back(slowest[1]);
    update.push_back(slowest[2]);
    sync.push_back(slowest[3]);
    rest.push_back(slowest[0] - slowest[1] - slowest[2] - slowest[3]);
  }
  return StepTiming{median(step),   median(agree),          median(update),        median(sync),
                    median(rest),   median(update_longest), median(sync_longest)};
}

}  // namespace

int run_step(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const int world = comm->size();
  const Model model = make_model(o);
  const OptimizerConfig config = make_config(o);
  const UpdateShape shape = update_shape(o);
  const CacheInfo llc = last_level_cache();
  // The arrays are the same size on every rank (the bandwidths sum them).
  const int64_t array_bytes = o.stream_mb > 0 ? o.stream_mb << 20 : max_int64(*comm, stream_array_bytes(llc));

  // The bandwidths are measured in two windows, one before the model exists and one after the
  // timed steps, and each pattern's best counts: on a machine whose other load comes and goes,
  // a single window may catch a busy moment that the steps did not see. The first window needs
  // the peak RSS to be reset after it (its arrays would otherwise be the run's peak); where that
  // cannot be done on every rank, only the second window is measured.
  const bool two_windows = max_int64(*comm, reset_peak_rss(true) ? 0 : 1) == 0;
  StreamResult stream_before;
  if (two_windows) {
    stream_before = measure_stream(*comm, o.threads, array_bytes, shape, o.dtype);
    reset_peak_rss(false);
  }
  // The process before the model exists (MPI, libraries), to set peak RSS against.
  const int64_t base_rss = max_int64(*comm, peak_rss_bytes());

  ExternalBuffers external;
  std::unique_ptr<ZeroOptimizer> opt = build_optimizer(comm, o, config, model.tensors, external);

  // Stage 2: the gradients reach the owners through a reduce round before every step (untimed).
  std::vector<float> grad_scratch;
  const auto prepare = [&] {
    if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
  };
  const StepTiming timing = time_steps(*comm, *opt, o.warmup, o.iters, prepare);
  const double step_s = timing.step_s;
  const shardopt::MemoryReport memory = opt->memory_report();
  // Read now: the high-water mark of the optimizer alone, before the second bandwidth window's
  // arrays and the reference exist.
  const int64_t peak_rss = max_int64(*comm, peak_rss_bytes());

  // Bytes the step must move (see roofline.hpp), summed over the ranks.
  const StepBytes counted = count_step_bytes(*comm, o, model, memory, llc);
  const std::vector<int64_t>& shards = counted.shards;
  const int64_t my_moved = counted.my_moved;
  const int64_t update_bytes = counted.update;
  const int64_t sync_bytes = counted.sync;
  const int64_t total_bytes = update_bytes + sync_bytes;
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  const int64_t max_state = max_int64(*comm, memory.state_bytes);
  const int64_t max_master = max_int64(*comm, memory.master_bytes);
  const int64_t max_grad = max_int64(*comm, memory.grad_bytes);
  const bool cache_resident = counted.cache_resident;

  // The roofline: every byte at the best bandwidth any pattern reached with every rank
  // streaming at once, in either window.
  const StreamResult stream_after = measure_stream(*comm, o.threads, array_bytes, shape, o.dtype);
  const StreamResult stream = two_windows ? best_of(stream_before, stream_after) : stream_after;
  const double roofline_gbps = stream.best_gbps();
  const auto roofline_seconds = [&](int64_t bytes) { return static_cast<double>(bytes) / (roofline_gbps * 1e9); };
  const auto gbps = [](int64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0; };
  const double roofline_s = roofline_seconds(total_bytes);
  const RooflineVerdict step_verdict = judge_roofline(roofline_s, step_s, cache_resident);
  const RooflineVerdict update_verdict = judge_roofline(roofline_seconds(update_bytes), timing.update_longest_s, cache_resident);
  const RooflineVerdict sync_verdict = judge_roofline(roofline_seconds(sync_bytes), timing.sync_longest_s, cache_resident);
  // What is printed is judged: the parts only with --breakdown.
  bool measurement_error = step_verdict.status == RooflineStatus::measurement_error;
  if (o.breakdown) {
    measurement_error = measurement_error || update_verdict.status == RooflineStatus::measurement_error ||
                        sync_verdict.status == RooflineStatus::measurement_error;
  }
  const RooflineStatus status = measurement_error ? RooflineStatus::measurement_error : step_verdict.status;

  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    wrong_total = count_wrong_params(comm, o, model, *opt, o.warmup + o.iters);
    wrong = std::to_string(wrong_total);
  }

  // The gradient average before a step (not part of step_ms): reduce_gradients() over the same
  // synthetic gradients, whose coarse values average to themselves. Stage 2 hands them.
  double reduce_s = 0;
  if (o.breakdown) {
    reduce_s = time_collectively(*comm, o.warmup, o.iters, [&] {
      if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
      else opt->reduce_gradients();
    });
  }

  const char* mode = o.sharded ? "sharded" : "replicated";
  say(*comm,
      "world={} params={} {} optimizer={} partition={} dtype={} stage={} storage={} threads={} bucket_bytes={} pipeline_chunk_bytes={} mode={} "
      "state_precision={} master={} iters={} warmup={} cpu_isa={} node_ranks={} shard_numel_max={} state_bytes_per_rank={} master_bytes_per_rank={} "
      "grad_bytes_per_rank={} peak_rss_mb={:.1f} base_rss_mb={:.1f} "
      "update_bytes={} sync_bytes={} stream_copy_gbps={:.2f} stream_triad_gbps={:.2f} "
      "stream_update_gbps={:.2f} stream_array_mb={} stream_windows={} llc_mb={} llc_instances={} llc_source={} sysconf_llc_mb={} "
      "roofline_gbps={:.2f} roofline_pattern={} roofline_ms={:.3f} "
      "step_ms_median={:.3f} params_per_s={:.4g} achieved_gbps={:.2f} roofline_fraction={} roofline_status={} wrong={}\n",
      world, model.numel, model.description, shardopt::algorithm_name(o.algorithm),
      shardopt::partition_name(o.partition), shardopt::dtype_name(o.dtype), config.stage,
      o.storage == Storage::bucket_view ? "bucket_view" : "external", effective_threads(o.threads), o.bucket_bytes,
      o.pipeline_chunk_bytes, mode, shardopt::state_precision_name(o.state_precision),
      shardopt::master_storage_name(o.master), o.iters, o.warmup, shardopt::cpu_kernel_isa(), memory.node_ranks, *std::max_element(shards.begin(), shards.end()), max_state,
      max_master, max_grad, static_cast<double>(peak_rss) / (1 << 20), static_cast<double>(base_rss) / (1 << 20),
      update_bytes, sync_bytes, stream.copy_gbps, stream.triad_gbps, stream.update_gbps, stream.array_bytes >> 20, two_windows ? 2 : 1,
      llc.instance_bytes >> 20, llc.node_instances, llc.source, llc.sysconf_bytes >> 20, roofline_gbps, stream.best_pattern(), roofline_s * 1e3,
      step_s * 1e3, step_s > 0 ? static_cast<double>(model.numel) / step_s : 0.0, gbps(total_bytes, step_s),
      format_fraction(step_verdict), status_name(status), wrong);

  if (o.breakdown) {
    // What a copying sync should run at, in the same run: a blocking MPI_Allgather of the
    // largest shard per rank, and a memcpy of what this rank receives (none when the node
    // shares one buffer: then the sync is a barrier).
    const int64_t block_bytes = *std::max_element(shards.begin(), shards.end()) * element_bytes;
    const SyncPeers peers = sync_bytes > 0 && o.storage == Storage::bucket_view
                                ? time_sync_peers(*comm, block_bytes, my_moved * element_bytes, o.warmup, o.iters)
                                : SyncPeers{};
    const auto ms_or_na = [](double s) { return s > 0 ? fmt::format("{:.3f}", s * 1e3) : std::string("n/a"); };
    const auto ratio_or_na = [](double a, double b) { return a > 0 && b > 0 ? fmt::format("{:.2f}", a / b) : std::string("n/a"); };
    say(*comm,
        "breakdown: agree_ms_median={:.3f} update_ms_median={:.3f} sync_ms_median={:.3f} rest_ms_median={:.3f} "
        "update_gbps={:.2f} update_roofline_fraction={} sync_gbps={:.2f} sync_roofline_fraction={} "
        "reduce_gradients_ms_median={:.3f} mpi_allgather_ms_median={} memcpy_ms_median={} "
        "sync_vs_mpi_allgather={} sync_vs_memcpy={}\n",
        timing.agree_s * 1e3, timing.update_s * 1e3, timing.sync_s * 1e3, timing.rest_s * 1e3,
        gbps(update_bytes, timing.update_longest_s), format_fraction(update_verdict), gbps(sync_bytes, timing.sync_longest_s),
        format_fraction(sync_verdict), reduce_s * 1e3, ms_or_na(peers.mpi_allgather_s), ms_or_na(peers.memcpy_s),
        ratio_or_na(timing.sync_s, peers.mpi_allgather_s), ratio_or_na(timing.sync_s, peers.memcpy_s));
  }
  if (wrong_total != 0) return 1;
  return measurement_error ? 3 : 0;
}

}  // namespace shardopt_bench
