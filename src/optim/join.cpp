// src/optim/join.cpp — a rank in join() shadowing the active ranks' reductions, clipping and steps, and the divisor of their gradient average.
#include "optim/join.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "optim/agreement_fields.hpp"
#include "optim/round_gate.hpp"

namespace shardopt {
namespace optim {
namespace {

// Through the gate's agree_joinable: a refused join() (an averager attached) is relayed from
// there to the averaging's communicators.
comm::Agreed agree_shadowing(ZeroOptimizer::Impl& im, comm::AgreementRecord& record) {
  record.set_shadowing();
  return agree_joinable(im, record);
}

// The record a rank in join() offers before it knows the active ranks' call: every number any
// shadowed call may need from it.
// The pass's first record enters the gate (the caller must come in between rounds); within a
// pass the round this rank opened by handing zeros stays open until the active ranks finish it.
comm::AgreementRecord shadow_record(ZeroOptimizer::Impl& im, bool first) {
  comm::AgreementRecord record = first ? enter(im, GateCall::join) : continue_record("join");
  record.validate([&] {
    const kernels::GradStats two = im.step.local_grad_stats(false);
    const kernels::GradStats inf = im.step.local_grad_stats(true);
    record.set_payload(kShadowNormTwo, comm::double_bits(two.value));
    record.set_payload(kShadowNormInf, comm::double_bits(inf.value));
    record.set_payload(kShadowFlags, (inf.nonfinite ? 1u : 0u) | (im.step.local_nonfinite() ? 2u : 0u));
    record.set_payload(kStepStateHash, step_state_hash(im));
  });
  return record;
}

// reduce_gradients (stage 1, external storage) or the end of a stage-2 round: zeros in, the
// same collectives as the active ranks.
// config.overlap: a round the active ranks opened (`agreed`), with zeros for every bucket.
void shadow_open_overlapped(ZeroOptimizer::Impl& im, const comm::Agreed& agreed) {
  if (im.overlap.per_bucket()) im.async_save.wait_for_sources();  // the buckets' updates start in this round
  begin_overlapped_round(im, agreed, /*explicit_hand_over=*/false);
  im.overlap.hand_zeros();
}

// config.overlap, the active ranks in reduce_gradients(): `agreed` opened the round (no
// hand-over came first; the order check follows), or it was the order check of the round the
// active ranks' first hand-over opened. The buckets of a round with a rank in join() are
// issued after the order check, in position order, on every rank.
void shadow_reduce_overlapped(ZeroOptimizer::Impl& im, const comm::Agreed& agreed) {
  try {
    if (!im.overlap.round_open()) {
      shadow_open_overlapped(im, agreed);
      im.overlap.close_hand_over();
      comm::AgreementRecord handed = continue_record("reduce_gradients");
      agree_shadowing(im, handed);
    } else {
      im.overlap.close_hand_over();
    }
    im.overlap.settle_round();
  } catch (...) {
    abandon_overlapped_round(im);
    throw;
  }
}

void shadow_reduce_gradients(ZeroOptimizer::Impl& im, const comm::Agreed& agreed) {
  if (im.overlap.enabled()) {
    shadow_reduce_overlapped(im, agreed);
    return;
  }
  prepare_reduction(im, agreed);
  if (!(im.shard.stage2() && im.shard.bucket_view())) {
    // Zero gradients: its own (bucket view) or the caller's registered buffers (external).
    for (std::size_t i = 0; i < im.table.size(); ++i) {
      const int64_t n = im.table.params()[i].numel;
      if (n > 0) im.dev.zero_bytes(im.shard.grad_ptr(i), span_bytes(n, im.table.dtype()));
    }
  }
  // Stage 2 with grad views, the active ranks reading theirs in place (no hand-over opened the
  // round): zeros into this rank's slot.
  if (im.shard.stage2_grad_views() && !im.reducer.round_started()) im.reducer.hand_zeros();
  im.reducer.reduce_all();
  if (!im.shard.stage2()) return;
  comm::AgreementRecord handed = continue_record("reduce_gradients");
  agree_shadowing(im, handed);  // the active ranks' hand-over order check
}

void shadow_step(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, double agree_seconds) {
  check_shadows_step_state(agreed);
  bool any_nonfinite = false;
  for (std::size_t r = 0; r < agreed.payloads.size(); ++r) {
    const comm::Payload& p = agreed.payloads[r];
    any_nonfinite = any_nonfinite || (agreed.shadowing[r] ? (p[kShadowFlags] & 2u) != 0 : p[0] != 0);
  }
  // The params the active ranks step without a gradient: their count rides in slot 1, the ids
  // come from the reference rank.
  const uint64_t sitting_out = agreed.payloads[static_cast<std::size_t>(agreed.reference)][1];
  std::vector<ParamId> ids(static_cast<std::size_t>(sitting_out));
  comm::broadcast_values(im.dev.host_comm(), ids, agreed.reference);
  for (ParamId id : ids) im.table.param(id).sits_out_step = true;
  im.step.run(any_nonfinite, agree_seconds);
}

}  // namespace

std::vector<kernels::GradStats> clip_parts(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, bool inf_norm) {
  std::vector<kernels::GradStats> parts;
  for (std::size_t r = 0; r < agreed.payloads.size(); ++r) {
    // Replicated state: every rank's runs cover every gradient, so its own value is the total.
    if (!im.shard.sharded() && static_cast<int>(r) != im.dev.rank()) continue;
    const comm::Payload& p = agreed.payloads[r];
    if (agreed.shadowing[r]) {
      parts.push_back({comm::bits_double(p[inf_norm ? kShadowNormInf : kShadowNormTwo]), (p[kShadowFlags] & 1u) != 0});
    } else {
      parts.push_back({comm::bits_double(p[0]), p[1] != 0});
    }
  }
  return parts;
}

bool shadow_until_step(ZeroOptimizer::Impl& im) {
  for (bool first = true;; first = false) {
    comm::AgreementRecord record = shadow_record(im, first);
    const auto start = std::chrono::steady_clock::now();
    const comm::Agreed agreed = agree_shadowing(im, record);
    if (agreed.active() == 0) return false;
    const std::string& op = agreed.operation;
    if (op == "reduce_gradients") {
      shadow_reduce_gradients(im, agreed);
    } else if (op == "reduce_gradient") {
      // A round opened by the active ranks' first hand-over: zeros for every param.
      if (im.overlap.enabled()) {
        shadow_open_overlapped(im, agreed);
        continue;
      }
      prepare_reduction(im, agreed);
      im.reducer.hand_zeros();
    } else if (op == "clip_grad_norm") {
      // The factor is armed from every rank's statistics alike; this rank's were in its record.
      const comm::Payload& ref = agreed.payloads[static_cast<std::size_t>(agreed.reference)];
      const double max_norm = comm::bits_double(ref[2]);
      const bool inf_norm = std::isinf(comm::bits_double(ref[3]));
      const std::vector<kernels::GradStats> parts = clip_parts(im, agreed, inf_norm);
      im.step.arm_clip(max_norm, inf_norm, parts);
    } else if (op == "step") {
      im.async_save.wait_for_sources();
      shadow_step(im, agreed, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return true;
    } else {
      comm::raise_if_joined(agreed, op);
    }
  }
}

}  // namespace optim
}  // namespace shardopt
