// src/optim/step.cpp — loss scaling (GradScaler's rules), the clip factor, and the update of this rank's shard on the CPU or the device.
#include "optim/step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>


namespace shardopt {
namespace optim {

Step::Step(const DeviceContext& dev, const OptimizerConfig& config, ParamTable& table, ShardState& shard,
           ParamSync& sync)
    : dev_(dev), config_(config), table_(table), shard_(shard), sync_(sync), muon_(dev, config, shard) {
  scale_ = config.loss_scaling.enabled ? config.loss_scaling.init_scale : 1.0;
}

// 1/scale in float, as GradScaler's inv_scale = scale.double().reciprocal().float().
float Step::unscale_factor() const { return config_.loss_scaling.enabled ? static_cast<float>(1.0 / scale_) : 1.f; }

kernels::GradStats Step::local_grad_stats(bool inf_norm) {
  const device::ScopedDevice scope(dev_.device());
  const DType dt = shard_.dtype();
  kernels::GradStats total;
  if (dev_.on_device()) {
    // Two doubles of results, then the reductions' workspace: allocated on first use and kept,
    // so that no step allocates (without a workspace, each launch would allocate its own).
    DeviceOps& ops = dev_.ops();
    if (stats_scratch_.empty()) {
      stats_scratch_ = dev_.new_buffer(4 + static_cast<int64_t>(ops.grad_stats_workspace_bytes() / sizeof(float)));
    }
    bool first = true;
    for (const UpdateRun& run : shard_.runs()) {
      ops.grad_stats(run.grad, dt, run.length, unscale_factor(), inf_norm,
                     reinterpret_cast<double*>(stats_scratch_.data()), !first, stats_scratch_.data() + 4,
                     dev_.stream());
      first = false;
    }
    if (first) return total;
    double host[2] = {0.0, 0.0};
    dev_.copy_bytes(host, stats_scratch_.data(), sizeof(host));
    dev_.synchronize("gradient statistics");
    total.value = host[0];
    total.nonfinite = host[1] != 0.0;
    return total;
  }
  for (const UpdateRun& run : shard_.runs()) {
    const kernels::GradStats part =
        kernels::grad_stats_cpu(run.grad, dt, run.length, unscale_factor(), inf_norm, config_.cpu_threads);
    total.value = inf_norm ? std::max(total.value, part.value) : total.value + part.value;
    total.nonfinite = total.nonfinite || part.nonfinite;
  }
  return total;
}

double Step::arm_clip(double max_norm, bool inf_norm, const std::vector<kernels::GradStats>& parts) {
  double combined = 0.0;
  bool any_nonfinite = false;
  for (const kernels::GradStats& part : parts) {
    combined = inf_norm ? std::max(combined, part.value) : combined + part.value;
    any_nonfinite = any_nonfinite || part.nonfinite;
  }
  // torch returns the norm as a float32 tensor and derives the factor in float32:
  // max_norm * reciprocal(norm + 1e-6), clamped at 1.
  float norm = static_cast<float>(inf_norm ? combined : std::sqrt(combined));
  if (any_nonfinite) norm = std::numeric_limits<float>::quiet_NaN();
  const float coef = (1.f / (norm + 1e-6f)) * static_cast<float>(max_norm);
  pending_clip_ = coef < 1.f ? coef : (std::isnan(coef) ? coef : 1.f);
  pending_norm_ = norm;
  nonfinite_known_ = true;
  nonfinite_ = any_nonfinite;
  return norm;
}

bool Step::local_nonfinite() {
  if (nonfinite_known_) return nonfinite_;  // already agreed by clip_grad_norm()
  if (!config_.loss_scaling.enabled) return false;
  return local_grad_stats(/*inf_norm=*/true).nonfinite;
}

void Step::hold_round_hyperparams() { held_.assign(table_.groups().begin(), table_.groups().end()); }

const Hyperparams& Step::hyper(int group) const {
  const auto g = static_cast<std::size_t>(group);
  return g < held_.size() ? held_[g] : table_.groups()[g];
}

void Step::run(bool any_nonfinite, double agree_seconds) {
  // The round's held hyperparameters end with its step, whatever happens in it.
  struct Release {
    Step& step;
    ~Release() { step.release_round_hyperparams(); }
  } release{*this};
  // Params without a gradient this step leave the update runs for this step only, and come
  // back even when the step fails.
  bool any_sitting_out = false;
  for (const ParamRecord& p : table_.params()) any_sitting_out = any_sitting_out || p.sits_out_step;
  if (!any_sitting_out) {
    run_all(any_nonfinite, agree_seconds);
    return;
  }
  const auto end_sitting_out = [&] {
    for (std::size_t i = 0; i < table_.size(); ++i) table_.param(static_cast<ParamId>(i)).sits_out_step = false;
    shard_.refresh_runs();
  };
  shard_.refresh_runs();
  try {
    run_all(any_nonfinite, agree_seconds);
  } catch (...) {
    end_sitting_out();
    throw;
  }
  end_sitting_out();
}

void Step::run_all(bool any_nonfinite, double agree_seconds) {
  const device::ScopedDevice scope(dev_.device());
  const bool scaling = config_.loss_scaling.enabled;
  report_.agree_seconds = agree_seconds;
  report_.update_seconds = 0.0;
  report_.sync_seconds = 0.0;
  report_.newton_schulz_seconds = 0.0;
  report_.loss_scale = scaling ? scale_ : 1.0;
  report_.grad_norm = pending_norm_;
  report_.clip_coef = pending_clip_;
  report_.skipped = scaling && any_nonfinite;
  if (report_.skipped) {
    // GradScaler.update(): back off and restart the growth count; nothing else changes.
    scale_ = std::max(scale_ * config_.loss_scaling.backoff_factor, config_.loss_scaling.min_scale);
    growth_tracker_ = 0;
    ++report_.skipped_steps;
  } else {
    shard_.ensure_state_kinds();
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    double update_seconds = 0.0;
    const std::function<void(int64_t, int64_t)> update = [&](int64_t lo, int64_t hi) {
      const auto update_start = Clock::now();
      update_range(lo, hi);
      update_seconds += std::chrono::duration<double>(Clock::now() - update_start).count();
    };
    if (driver_) {
      driver_(update);
    } else {
      sync_.update_and_sync(update);
    }
    report_.update_seconds = update_seconds;
    report_.newton_schulz_seconds = muon_.take_newton_schulz_seconds();
    report_.sync_seconds = std::chrono::duration<double>(Clock::now() - start).count() - update_seconds;
    advance_steps();
    if (scaling && ++growth_tracker_ == config_.loss_scaling.growth_interval) {
      scale_ *= config_.loss_scaling.growth_factor;
      growth_tracker_ = 0;
    }
  }
  pending_clip_ = 1.f;
  pending_norm_ = -1.0;
  nonfinite_known_ = false;
  nonfinite_ = false;
}

void Step::set_loss_scale(double scale, int64_t growth_tracker) {
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

void Step::update_range(int64_t lo, int64_t hi) {
  const int threads = config_.cpu_threads;
  const DType dt = shard_.dtype();
  const bool low_precision = dt != DType::f32;
  const kernels::GradTransform transform{unscale_factor(), pending_clip_};
  for (const UpdateRun& whole : shard_.runs()) {
    const ParamRecord& owner = table_.params()[static_cast<std::size_t>(whole.first_param)];
    if (table_.algorithm(owner.group) == Algorithm::muon) {
      // A matrix is updated whole, by the call whose range holds its first element (its run is
      // one whole parameter: Muon runs never merge).
      if (whole.shard_offset >= lo && whole.shard_offset < hi) {
        muon_.update(whole, owner, hyper(owner.group), transform);
      }
      continue;
    }
    const int64_t begin = std::max(lo, whole.shard_offset);
    const int64_t end = std::min(hi, whole.shard_offset + whole.length);
    if (begin >= end) continue;
    const int64_t skip = begin - whole.shard_offset;
    UpdateRun run = whole;
    // A range cuts no 8-bit run (registration refuses the chunked and per-bucket updates).
    SHARDOPT_CHECK(!whole.q8 || (begin == whole.shard_offset && end == whole.shard_offset + whole.length), internal,
                   "update range [{}, {}) cuts an 8-bit run [{}, {})", lo, hi, whole.shard_offset,
                   whole.shard_offset + whole.length);
    run.shard_offset = begin;
    run.length = end - begin;
    run.param += span_bytes(skip, dt);
    run.grad += span_bytes(skip, dt);
    run.first_index += skip;
    for (int64_t& offset : run.state_offset) offset += offset >= 0 ? skip : 0;
    const ParamRecord& p = table_.params()[static_cast<std::size_t>(run.first_param)];
    const Hyperparams& h = hyper(p.group);
    auto at = [&](std::size_t kind) {
      if (shard_.state()[kind].empty() || run.state_offset[kind] < 0) return static_cast<float*>(nullptr);
      return shard_.state_data(kind) + run.state_offset[kind];
    };
    kernels::UpdateTensors tensors;
    tensors.param = run.param;
    tensors.grad = run.grad;
    const bool remainder = shard_.remainder_master(p);
    tensors.master = low_precision && !remainder ? at(kMaster) : nullptr;
    tensors.master_remainder = remainder ? shard_.master_remainders() + run.shard_offset : nullptr;
    tensors.dtype = dt;
    kernels::Rounding rounding;
    rounding.stochastic = config_.stochastic_rounding;
    rounding.seed = config_.rounding_seed;
    rounding.step = static_cast<uint64_t>(p.step + 1);
    rounding.first_index = static_cast<uint64_t>(run.first_index);
    const Algorithm algorithm = table_.algorithm(p.group);
    if (algorithm == Algorithm::sgd) {
      const kernels::SgdScalars s = kernels::make_sgd_scalars(h.lr, h.momentum, h.dampening, h.weight_decay, h.nesterov,
                                                              h.maximize, !p.has_momentum_buffer);
      if (dev_.on_device()) {
        dev_.ops().sgd_update(tensors, at(kMomentum), run.length, s, transform, rounding, dev_.stream());
      } else {
        kernels::sgd_update_cpu(tensors, at(kMomentum), run.length, s, transform, rounding, threads);
      }
    } else {
      const kernels::AdamScalars s =
          kernels::make_adam_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                                     algorithm == Algorithm::adamw, h.amsgrad, h.maximize, p.step + 1);
      if (run.q8 && dev_.on_device()) {
        dev_.ops().adam_update_q8(tensors, shard_.q8_moments(run), run.length, s, transform, rounding, dev_.stream());
      } else if (run.q8) {
        kernels::adam_update_q8_cpu(tensors, shard_.q8_moments(run), run.length, s, transform, rounding, threads);
      } else if (dev_.on_device()) {
        dev_.ops().adam_update(tensors, at(kExpAvg), at(kExpAvgSq), at(kMaxExpAvgSq), run.length, s, transform,
                               rounding, dev_.stream());
      } else {
        kernels::adam_update_cpu(tensors, at(kExpAvg), at(kExpAvgSq), at(kMaxExpAvgSq), run.length, s, transform,
                                 rounding, threads);
      }
    }
  }
}

// Every rank advances every trainable param, so step counts agree without communication.
void Step::advance_steps() {
  bool buffers_created = false;
  for (std::size_t i = 0; i < table_.size(); ++i) {
    ParamRecord& p = table_.param(static_cast<ParamId>(i));
    if (!p.trainable || p.sits_out_step) continue;
    ++p.step;
    // torch keeps a momentum buffer through steps taken with momentum 0 and resumes it.
    // Muon creates its momentum_buffer at the first step, whatever its momentum.
    const Algorithm algorithm = table_.algorithm(p.group);
    const bool creates = algorithm == Algorithm::muon || (algorithm == Algorithm::sgd && hyper(p.group).momentum != 0.0);
    if (creates && !p.has_momentum_buffer) {
      p.has_momentum_buffer = true;
      buffers_created = true;
    }
  }
  // Every trainable param advanced alike, so runs stay merged as they are unless a momentum
  // buffer appeared (runs only merge params with the same buffer state).
  if (buffers_created) shard_.refresh_runs();
}

}  // namespace optim
}  // namespace shardopt
