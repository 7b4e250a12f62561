// src/optim/zero_optimizer_round.cpp — ZeroOptimizer's gradient round: hand-over, reduction, clipping, step and Join, each entering through the round gate.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "optim/join.hpp"
#include "optim/round_gate.hpp"

namespace shardopt {

using comm::AgreementRecord;
using optim::GateCall;

void ZeroOptimizer::reduce_gradients() try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::reduce_gradients);
  if (im.overlap.enabled()) {
    optim::reduce_overlapped(im, std::move(record));
  } else {
    // Ranks in join() contribute zeros; the average divides by the ranks that contributed.
    optim::prepare_reduction(im, optim::agree_joinable(im, record));
    const uint64_t order = im.reducer.reduce_all();
    if (im.shard.stage2()) {
      // Buckets handed in another order on some rank were matched with the wrong collectives:
      // refuse the round on every rank rather than step on mixed-up gradients.
      AgreementRecord handed = optim::continue_record("reduce_gradients");
      handed.field("gradient hand-over order", fmt::format("the reduce_gradient() calls hashing to {:#018x}", order));
      optim::agree_joinable(im, handed);
    }
  }
  optim::leave(im, GateCall::reduce_gradients);
} catch (const Error& e) {
  optim::raise_within("reduce_gradients", e);
}

void ZeroOptimizer::reduce_gradient(ParamId id, const TensorRef& grad) try {
  Impl& im = *impl_;
  if (im.overlap.enabled()) {
    if (!im.overlap.round_open()) optim::open_overlapped_round(im, "reduce_gradient", true);
    im.overlap.hand(id, grad);
    return;
  }
  if (im.shard.stage2() && im.shard.bucket_view() && !im.reducer.round_started()) {
    // A round opens with a small agreement: it tells the ranks in join() to hand zeros, and
    // every rank which ranks contribute, before any bucket is reduced.
    optim::prepare_reduction(im, optim::agree_joinable(im, optim::enter(im, GateCall::hand_gradient)));
    im.reducer.hand(id, grad);
    optim::leave(im, GateCall::hand_gradient);
    return;
  }
  im.reducer.hand(id, grad);
} catch (const Error& e) {
  optim::raise_within("reduce_gradient", e);
}

void ZeroOptimizer::grad_ready(ParamId id) try {
  Impl& im = *impl_;
  const std::string& name = im.table.param(id).name;  // range check
  SHARDOPT_CHECK(im.shard.bucket_view(), invalid_argument,
                 "grad_ready('{}'): for gradients written into grad_view() (bucket view); with external storage "
                 "reduce_gradients() reads the registered gradient buffers",
                 name);
  SHARDOPT_CHECK(!im.shard.stage2() || im.shard.stage2_grad_views(), invalid_argument,
                 "grad_ready('{}'): at stage 2 shardopt keeps only this rank's shard of the gradients (a whole "
                 "gradient buffer only on one node, with node-shared parameters); hand "
                 "each gradient with reduce_gradient()",
                 name);
  if (!im.overlap.enabled()) return;  // reduce_gradients() reads every gradient in place
  if (!im.overlap.round_open()) optim::open_overlapped_round(im, "reduce_gradient", true);
  im.overlap.ready(id);
} catch (const Error& e) {
  optim::raise_within("grad_ready", e);
}

void ZeroOptimizer::wait_param(ParamId id) { impl_->overlap.wait_param(id); }
void ZeroOptimizer::wait_bucket(int bucket) { impl_->overlap.wait_bucket(bucket); }
void ZeroOptimizer::wait_all() { impl_->overlap.wait_all(); }
int ZeroOptimizer::num_buckets() const { return impl_->overlap.num_buckets(); }

double ZeroOptimizer::clip_grad_norm(double max_norm, double norm_type) try {
  Impl& im = *impl_;
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  AgreementRecord record = optim::enter(im, GateCall::clip_grad_norm);
  record.field("max_norm", fmt::format("{}", max_norm));
  record.field("norm_type", fmt::format("{}", norm_type));
  record.validate([&] {
    SHARDOPT_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, invalid_argument,
                   "clip_grad_norm: max_norm must be a finite number >= 0, got {}", max_norm);
    SHARDOPT_CHECK(inf_norm || norm_type == 2.0, invalid_argument,
                   "clip_grad_norm: norm_type {} is not supported (2 or inf)", norm_type);
    SHARDOPT_CHECK(!im.overlap.per_bucket(), invalid_argument,
                   "clip_grad_norm: config.overlap = per_bucket updates each bucket as soon as its reduction lands, "
                   "before a norm over all gradients exists, so it cannot clip; use overlap = after_backward");
    // This rank's partial: a double and the inf/NaN flag, moved in the record's payload.
    const kernels::GradStats mine = im.step.local_grad_stats(inf_norm);
    record.set_payload(0, comm::double_bits(mine.value));
    record.set_payload(1, mine.nonfinite ? 1 : 0);
  });
  // The arguments ride along for the ranks in join(), which shadow this call.
  record.set_payload(2, comm::double_bits(max_norm));
  record.set_payload(3, comm::double_bits(norm_type));
  const comm::Agreed agreed = optim::agree_joinable(im, record);
  return im.step.arm_clip(max_norm, inf_norm, optim::clip_parts(im, agreed, inf_norm));
} catch (const Error& e) {
  optim::raise_within("clip_grad_norm", e);
}

double ZeroOptimizer::loss_scale() const { return impl_->step.loss_scale(); }

void ZeroOptimizer::set_loss_scale(double scale) {
  SHARDOPT_CHECK(impl_->config.loss_scaling.enabled, invalid_argument,
                 "set_loss_scale: loss scaling is not enabled in this optimizer's config");
  SHARDOPT_CHECK(std::isfinite(scale) && scale > 0, invalid_argument,
                 "set_loss_scale: the scale must be finite and > 0, got {}", scale);
  impl_->step.set_loss_scale(scale, 0);
}

const StepReport& ZeroOptimizer::last_step() const { return impl_->step.report(); }

void ZeroOptimizer::step() { step(std::vector<ParamId>{}); }

void ZeroOptimizer::step(const std::vector<ParamId>& without_grad) try {
  Impl& im = *impl_;
  // (The gate first waits for a background save still reading the values this step changes.)
  AgreementRecord record = optim::enter(im, GateCall::step);
  optim::add_step_fields(im, record);
  // Which params sit this step out must agree, or ranks would update different shards.
  std::vector<ParamId> sitting_out = without_grad;
  std::sort(sitting_out.begin(), sitting_out.end());
  sitting_out.erase(std::unique(sitting_out.begin(), sitting_out.end()), sitting_out.end());
  record.validate([&] {
    for (ParamId id : sitting_out) im.table.param(id);  // range check
    SHARDOPT_CHECK(sitting_out.empty() || !im.overlap.per_bucket(), invalid_argument,
                   "step(without_grad): config.overlap = per_bucket has updated every bucket as its reduction landed; "
                   "params cannot sit a step out");
  });
  std::string sitting_out_text;
  for (ParamId id : sitting_out) sitting_out_text += (sitting_out_text.empty() ? "ids " : ",") + std::to_string(id);
  record.field("params without a gradient", sitting_out_text.empty() ? "none" : sitting_out_text);
  // Loss scaling needs to know, on every rank alike, whether any gradient is inf or NaN.
  record.validate([&] { record.set_payload(0, im.step.local_nonfinite() ? 1 : 0); });
  // For ranks in join(): how many params sit out, and the state they must step with.
  record.set_payload(1, sitting_out.size());
  record.set_payload(optim::kStepStateHash, optim::step_state_hash(im));
  const auto start = std::chrono::steady_clock::now();
  const comm::Agreed agreed = optim::agree_joinable(im, record);
  optim::check_shadows_step_state(agreed);
  bool any_nonfinite = false;
  bool any_joined = false;
  for (std::size_t r = 0; r < agreed.payloads.size(); ++r) {
    const comm::Payload& p = agreed.payloads[r];
    any_joined = any_joined || agreed.shadowing[r];
    any_nonfinite = any_nonfinite || (agreed.shadowing[r] ? (p[optim::kShadowFlags] & 2u) != 0 : p[0] != 0);
  }
  if (any_joined && !sitting_out.empty()) {
    // The ranks in join() learn which params sit out from the lowest active rank.
    // Kept allocated after a timeout: a late peer may still write into it.
    comm::broadcast_values(im.dev.host_comm(), sitting_out, agreed.reference);
  }
  for (ParamId id : sitting_out) im.table.param(id).sits_out_step = true;  // Step::run clears them
  im.step.run(any_nonfinite, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  optim::leave(im, GateCall::step);
} catch (const Error& e) {
  optim::raise_within("step", e);
}

bool ZeroOptimizer::join_step() try {
  const bool shadowed_a_step = optim::shadow_until_step(*impl_);
  optim::leave(*impl_, GateCall::join);
  return shadowed_a_step;
} catch (const Error& e) {
  optim::raise_within("join", e);
}

void ZeroOptimizer::join() {
  while (join_step()) {
  }
}

double ZeroOptimizer::step(const std::function<double()>& closure) {
  SHARDOPT_CHECK(static_cast<bool>(closure), invalid_argument, "step(closure): the closure is empty");
  const double loss = closure();
  step();
  return loss;
}


}  // namespace shardopt
