// bench/src/iteration.cpp — times reduce_gradients() and step() of each iteration, with a bandwidth probe before each, and sets both against their rooflines (see iteration.hpp).
#include "iteration.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cache.hpp"
#include "model.hpp"
#include "roofline.hpp"
#include "step_bytes.hpp"
#include "stream.hpp"
#include "support.hpp"
#include "verify.hpp"

namespace shardopt_bench {

using shardopt::ZeroOptimizer;

namespace {

// A probe between iterations: each pattern twice (a warm-up and one timed repetition), so the
// probes follow the machine's bandwidth from one iteration to the next at a small cost.
constexpr int kProbeRepetitions = 2;

struct Timed {
  std::vector<double> reduce_s, step_s, probe_gbps;  // per timed iteration, slowest rank
  StreamResult best;                                 // each pattern's best over the probes
};

std::string fraction_or_na(int64_t bytes, const RooflineVerdict& verdict) {
  return bytes > 0 ? format_fraction(verdict) : std::string("n/a");
}

}  // namespace

int run_iteration(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const Model model = make_model(o);
  const shardopt::OptimizerConfig config = make_config(o);
  const UpdateShape shape = update_shape(o);
  const CacheInfo llc = last_level_cache();
  const int64_t array_bytes = o.stream_mb > 0 ? o.stream_mb << 20 : max_int64(*comm, stream_array_bytes(llc));

  ExternalBuffers external;
  std::unique_ptr<ZeroOptimizer> opt = build_optimizer(comm, o, config, model.tensors, external);
  std::vector<float> grad_scratch;
  // The gradients average to themselves (model.hpp: coarse values, exact sums), so every
  // iteration reduces the same values and the self-check's reference stays comparable.
  const bool views = writes_grad_views(*opt, o) && o.storage == Storage::bucket_view;
  const bool overlapped = config.overlap != shardopt::OverlapPolicy::off;
  // --backward copy: the gradients as the views hold them now, written back every iteration.
  std::vector<std::vector<char>> backward_values;
  if (o.backward_copy && views) {
    for (shardopt::ParamId id = 0; id < opt->num_params(); ++id) {
      const shardopt::TensorRef g = opt->grad_view(id);
      backward_values.emplace_back(static_cast<const char*>(g.data), static_cast<const char*>(g.data) + g.nbytes());
    }
  }
  const auto reduce = [&] {
    if (views && (overlapped || o.backward_copy)) {
      for (shardopt::ParamId id = opt->num_params() - 1; id >= 0; --id) {
        if (o.backward_copy) {
          const std::vector<char>& g = backward_values[static_cast<std::size_t>(id)];
          std::memcpy(opt->grad_view(id).data, g.data(), g.size());
        }
        if (overlapped) opt->grad_ready(id);
      }
      opt->reduce_gradients();
    } else if (config.stage == 2) {
      hand_gradients(*opt, o, model.tensors, grad_scratch);
    } else {
      opt->reduce_gradients();
    }
  };
  for (int i = 0; i < o.warmup; ++i) {
    reduce();
    opt->step();
  }
  Timed timed;
  std::vector<double> my_reduce, my_step;
  for (int i = 0; i < o.iters; ++i) {
    const StreamResult probe = measure_stream(*comm, o.threads, array_bytes, shape, o.dtype, kProbeRepetitions);
    timed.probe_gbps.push_back(probe.best_gbps());
    timed.best.copy_gbps = std::max(timed.best.copy_gbps, probe.copy_gbps);
    timed.best.triad_gbps = std::max(timed.best.triad_gbps, probe.triad_gbps);
    timed.best.update_gbps = std::max(timed.best.update_gbps, probe.update_gbps);
    timed.best.array_bytes = probe.array_bytes;
    comm->barrier();
    auto start = Clock::now();
    reduce();
    my_reduce.push_back(seconds_since(start));
    comm->barrier();
    start = Clock::now();
    opt->step();
    my_step.push_back(seconds_since(start));
    comm->barrier();
  }
  timed.reduce_s = slowest_rank(*comm, my_reduce);
  timed.step_s = slowest_rank(*comm, my_step);

  const StepBytes bytes = count_step_bytes(*comm, o, model, opt->memory_report(), llc);
  const int64_t step_bytes = bytes.update + bytes.sync;
  const double roofline_gbps = timed.best.best_gbps();
  const auto at = [](int64_t b, double gbps) { return gbps > 0 ? static_cast<double>(b) / (gbps * 1e9) : 0.0; };
  std::vector<double> iteration_s, reduce_paired, step_paired, iteration_paired;
  for (std::size_t i = 0; i < timed.step_s.size(); ++i) {
    const double gbps = timed.probe_gbps[i];
    iteration_s.push_back(timed.reduce_s[i] + timed.step_s[i]);
    if (timed.reduce_s[i] > 0) reduce_paired.push_back(at(bytes.reduce, gbps) / timed.reduce_s[i]);
    step_paired.push_back(at(step_bytes, gbps) / timed.step_s[i]);
    iteration_paired.push_back(at(bytes.reduce + step_bytes, gbps) / iteration_s.back());
  }
  const double reduce_ms = median(timed.reduce_s) * 1e3;
  const double step_ms = median(timed.step_s) * 1e3;
  const double iteration_ms = median(iteration_s) * 1e3;
  const RooflineVerdict reduce_verdict = judge_roofline(at(bytes.reduce, roofline_gbps), reduce_ms / 1e3, bytes.cache_resident);
  const RooflineVerdict step_verdict = judge_roofline(at(step_bytes, roofline_gbps), step_ms / 1e3, bytes.cache_resident);
  const RooflineVerdict iteration_verdict =
      judge_roofline(at(bytes.reduce + step_bytes, roofline_gbps), iteration_ms / 1e3, bytes.cache_resident);
  const bool measurement_error = reduce_verdict.status == RooflineStatus::measurement_error ||
                                 step_verdict.status == RooflineStatus::measurement_error;
  const RooflineStatus status = measurement_error ? RooflineStatus::measurement_error : step_verdict.status;
  const auto [lowest, highest] = std::minmax_element(timed.probe_gbps.begin(), timed.probe_gbps.end());

  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    wrong_total = count_wrong_params(comm, o, model, *opt, o.warmup + o.iters);
    wrong = std::to_string(wrong_total);
  }
  say(*comm,
      "world={} params={} {} optimizer={} partition={} dtype={} stage={} storage={} threads={} bucket_bytes={} "
      "node_shared={} overlap={} backward={} grads={} iters={} warmup={} cpu_isa={} update_bytes={} sync_bytes={} "
      "reduce_bytes={} "
      "stream_copy_gbps={:.2f} stream_triad_gbps={:.2f} stream_update_gbps={:.2f} stream_array_mb={} "
      "probe_gbps_min={:.2f} probe_gbps_median={:.2f} probe_gbps_max={:.2f} probe_spread={:.2f} "
      "roofline_gbps={:.2f} roofline_pattern={} reduce_roofline_ms={:.3f} step_roofline_ms={:.3f} "
      "reduce_ms_median={:.3f} step_ms_median={:.3f} iteration_ms_median={:.3f} reduce_over_step={:.2f} "
      "iteration_over_step_roofline={:.2f} reduce_roofline_fraction={} reduce_paired_fraction={} "
      "step_roofline_fraction={} step_paired_fraction={:.3f} iteration_roofline_fraction={} "
      "iteration_paired_fraction={:.3f} roofline_status={} wrong={}\n",
      comm->size(), model.numel, model.description, shardopt::algorithm_name(o.algorithm),
      shardopt::partition_name(o.partition), shardopt::dtype_name(o.dtype), config.stage,
      o.storage == Storage::bucket_view ? "bucket_view" : "external", effective_threads(o.threads), o.bucket_bytes,
      o.node_shared_params ? 1 : 0, shardopt::overlap_policy_name(config.overlap),
      o.backward_copy && views ? "copy" : "none", views ? "views" : config.stage == 2 ? "handed" : "external", o.iters, o.warmup, shardopt::cpu_kernel_isa(), bytes.update, bytes.sync,
      bytes.reduce, timed.best.copy_gbps, timed.best.triad_gbps, timed.best.update_gbps, array_bytes >> 20, *lowest,
      median(timed.probe_gbps), *highest, *lowest > 0 ? *highest / *lowest : 0.0, roofline_gbps,
      timed.best.best_pattern(), at(bytes.reduce, roofline_gbps) * 1e3, at(step_bytes, roofline_gbps) * 1e3, reduce_ms,
      step_ms, iteration_ms, step_ms > 0 ? reduce_ms / step_ms : 0.0,
      step_bytes > 0 ? iteration_ms / (at(step_bytes, roofline_gbps) * 1e3) : 0.0,
      fraction_or_na(bytes.reduce, reduce_verdict),
      bytes.reduce > 0 ? fmt::format("{:.3f}", median(reduce_paired)) : std::string("n/a"), format_fraction(step_verdict),
      median(step_paired), fraction_or_na(bytes.reduce + step_bytes, iteration_verdict), median(iteration_paired),
      status_name(status), wrong);
  if (wrong_total != 0) return 1;
  return measurement_error ? 3 : 0;
}

}  // namespace shardopt_bench
