// src/optim/round.cpp — the step's agreed fields and their hash, the reduction's divisor, and the overlapped round's opening and order check.
#include "optim/round.hpp"

#include "core/check.hpp"
#include "optim/agreement_fields.hpp"
#include "optim/hyperparams.hpp"
#include "optim/round_gate.hpp"

namespace shardopt {
namespace optim {

void add_step_fields(ZeroOptimizer::Impl& im, comm::AgreementRecord& record) {
  for (int g = 0; g < im.table.num_groups(); ++g) {
    const Hyperparams& h = im.step.hyper(g);
    record.validate([&] { validate_hyperparams(h, im.table.algorithm(g), g); });
    add_group_fields(h, g, record);
  }
  record.field("loss scale", fmt::format("{}", im.step.loss_scale()));
  // Layout changes are collective, so equal versions mean equal layouts (and trainable flags).
  record.field("layout version", fmt::format("{}", im.shard.layout_version()));
}

uint64_t step_state_hash(ZeroOptimizer::Impl& im) {
  comm::AgreementRecord record = continue_record("step");
  add_step_fields(im, record);
  uint64_t h = comm::fnv1a("step state");
  for (uint64_t field : record.hashes()) h = (h ^ field) * 1099511628211ull;
  return h;
}

void check_shadows_step_state(const comm::Agreed& agreed) {
  const uint64_t expected = agreed.payloads[static_cast<std::size_t>(agreed.reference)][kStepStateHash];
  for (std::size_t r = 0; r < agreed.payloads.size(); ++r) {
    SHARDOPT_CHECK(!agreed.shadowing[r] || agreed.payloads[r][kStepStateHash] == expected, mismatch,
                   "step: rank {} is in join() with other hyperparameters, loss scale or layout than the active "
                   "rank {}: a rank in join() steps with the values it had when it joined, so they must not change "
                   "until every rank has left join()",
                   r, agreed.reference);
  }
}

void prepare_reduction(ZeroOptimizer::Impl& im, const comm::Agreed& agreed) {
  const int active = agreed.active();
  im.dev.set_gradient_divisor(im.config.divide_by_initial_world_size ? im.dev.world() : active);
  im.reducer.set_deferred(active < im.dev.world());
}

void begin_overlapped_round(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, bool explicit_hand_over) {
  if (im.overlap.per_bucket()) {
    check_shadows_step_state(agreed);
    im.step.hold_round_hyperparams();
  }
  prepare_reduction(im, agreed);
  im.overlap.open_round(agreed, explicit_hand_over);
}

// The opening record's fields under per_bucket: the live hyperparameters (held from here on),
// loss scale and layout, and their hash for the ranks in join().
void add_opening_fields(ZeroOptimizer::Impl& im, comm::AgreementRecord& record) {
  // A refused opening (say, a round opened before step() took in the last one's updates) leaves
  // the round it met alone: its buckets may still be updating with the held hyperparameters on
  // the communication thread, and its step() uses them.
  if (!im.overlap.per_bucket() || record.failed()) return;
  im.step.release_round_hyperparams();  // (none held between rounds: the gate saw to it)
  add_step_fields(im, record);
  record.set_payload(kStepStateHash, step_state_hash(im));
}

void open_overlapped_round(ZeroOptimizer::Impl& im, const char* operation, bool explicit_hand_over) {
  comm::AgreementRecord record = enter(im, GateCall::hand_gradient, operation);
  add_opening_fields(im, record);
  begin_overlapped_round(im, agree_joinable(im, record), explicit_hand_over);
  leave(im, GateCall::hand_gradient);
}

void reduce_overlapped(ZeroOptimizer::Impl& im, comm::AgreementRecord entered) {
  comm::AgreementRecord handed = std::move(entered);
  if (!im.overlap.round_open()) {
    // No hand-over came first: the gate's record opens the round, the order check follows.
    add_opening_fields(im, handed);
    begin_overlapped_round(im, agree_joinable(im, handed), false);
    handed = continue_record("reduce_gradients");
  }
  const OverlapEngine::RoundEnd end = im.overlap.close_hand_over();
  handed.field("bucket hand-over order", end.order);
  if (end.failure) handed.fail(*end.failure);
  try {
    agree_joinable(im, handed);
    im.overlap.settle_round();
  } catch (...) {
    abandon_overlapped_round(im);
    throw;
  }
}

void abandon_overlapped_round(ZeroOptimizer::Impl& im) noexcept {
  im.overlap.abandon_round();
  im.step.release_round_hyperparams();
}

}  // namespace optim
}  // namespace shardopt
