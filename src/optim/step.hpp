// src/optim/step.hpp — the step's local work: loss scaling, gradient clipping's factor, and the fused update dispatched over this rank's shard.
//
// The collective parts (agreeing on hyperparameters, on the inf/NaN flag, on the partial norms)
// happen in the facade's agreement records; what this module decides from their results is the
// same on every rank, so every rank computes the same scale, factor and step counts.
#pragma once

#include <functional>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "optim/muon_update.hpp"
#include "optim/param_sync.hpp"

namespace shardopt {
namespace optim {

class Step {
 public:
  Step(const DeviceContext& dev, const OptimizerConfig& config, ParamTable& table, ShardState& shard,
       ParamSync& sync);

  // This rank's share of the gradient statistics, over its shard's (averaged) gradients, with
  // the loss scale removed: the sum of squares (or max |g|) and whether any is inf/NaN.
  kernels::GradStats local_grad_stats(bool inf_norm);
  // Combines every rank's {value, nonfinite} (in rank order, so every rank gets the same bits),
  // arms the factor for the next step, and returns torch's float32 total norm.
  double arm_clip(double max_norm, bool inf_norm, const std::vector<kernels::GradStats>& parts);
  // The inf/NaN flag this rank contributes to the step's agreement (loss scaling only).
  bool local_nonfinite();
  // After the ranks agreed (which took `agree_seconds`): skip (loss scaling saw an inf/NaN on
  // some rank) or update and sync. Params marked sits_out_step are left as they are, and
  // unmarked afterwards.
  void run(bool any_nonfinite, double agree_seconds);

  // How the update reaches the shard and the sync follows (ParamSync::update_and_sync's
  // contract); unset: ParamSync::update_and_sync. The overlap engine sets its own.
  using UpdateDriver = std::function<void(const std::function<void(int64_t, int64_t)>&)>;
  void set_update_driver(UpdateDriver driver) { driver_ = std::move(driver); }
  // The update of this rank's shard elements [lo, hi) with the current step's scalars (no loss
  // scale, no clipping armed): the overlap engine's per-bucket update, on its thread.
  void update_part(int64_t lo, int64_t hi) { update_range(lo, hi); }
  // per_bucket: the hyperparameters the ranks agreed on when the round opened, held for the
  // round: its buckets' updates (on the communication thread) and step() use them, so a change
  // made through hyperparams(g) meanwhile reaches the next round whole, never half a round.
  void hold_round_hyperparams();
  void release_round_hyperparams() { held_.clear(); }
  // The values a step uses: the held ones within a per_bucket round, else the table's.
  const Hyperparams& hyper(int group) const;

  double loss_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  void set_loss_scale(double scale, int64_t growth_tracker);
  const StepReport& report() const { return report_; }

 private:
  float unscale_factor() const;
  void run_all(bool any_nonfinite, double agree_seconds);  // run() over the current update runs
  void update_range(int64_t lo, int64_t hi);
  void advance_steps();

  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  ParamTable& table_;
  ShardState& shard_;
  ParamSync& sync_;

  // GradScaler's state, and the clipping armed for the next step.
  double scale_ = 1.0;
  int64_t growth_tracker_ = 0;
  float pending_clip_ = 1.f;
  double pending_norm_ = -1.0;
  bool nonfinite_known_ = false;  // clip_grad_norm() already checked the gradients
  bool nonfinite_ = false;
  StepReport report_;
  core::FlatBuffer stats_scratch_;  // on a device: two doubles of gradient statistics, then the workspace
  UpdateDriver driver_;
  std::vector<Hyperparams> held_;
  MuonUpdate muon_;
};

}  // namespace optim
}  // namespace shardopt
