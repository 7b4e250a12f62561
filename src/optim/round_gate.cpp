// src/optim/round_gate.cpp — the table of legal calls per round state, and the gate's enter/agree/leave that every collective call runs.
#include "optim/round_gate.hpp"

#include <fmt/format.h>

#include "core/check.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {
namespace optim {
namespace {

constexpr unsigned bit(RoundState s) { return 1u << static_cast<unsigned>(s); }
constexpr unsigned kIdle = bit(RoundState::idle);
constexpr unsigned kOpen = bit(RoundState::round_open);
constexpr unsigned kReduced = bit(RoundState::reduced);
constexpr unsigned kUpdated = bit(RoundState::buckets_updated);
constexpr unsigned kBetweenRounds = kIdle | kReduced;

// The one table of legal transitions. A call absent from a state's column fails there, on
// every rank, before it changes anything.
const std::vector<CallRule> kRules = {
    {GateCall::construct, "ZeroOptimizer", kIdle, kDrainNothing, Leaves::idle, false,
     "agrees on the config and registers the first groups"},
    {GateCall::hand_gradient, "reduce_gradient", kBetweenRounds, kDrainSaveReadsPerBucket, Leaves::round_open, true,
     "opens a round (a small agreement: who contributes; per_bucket also agrees on the round's hyperparameters, "
     "which the whole round then uses); later hand-overs of the round need no agreement"},
    {GateCall::reduce_gradients, "reduce_gradients", kBetweenRounds | kOpen, kDrainSaveReadsPerBucket,
     Leaves::after_reduction, true, "finishes the round's reductions (per_bucket: and its updates)"},
    {GateCall::clip_grad_norm, "clip_grad_norm", kBetweenRounds, kDrainNothing, Leaves::unchanged, true,
     "reads the averaged gradients; per_bucket cannot clip (refused at every call: the buckets are updated before "
     "a norm over all gradients exists)"},
    {GateCall::step, "step", kBetweenRounds | kUpdated, kDrainSaveReads, Leaves::idle, true,
     "updates and syncs (overlap: leaves the all-gathers in flight, waited for per parameter)"},
    {GateCall::join, "join", kBetweenRounds, kDrainNothing, Leaves::idle, true,
     "shadows the active ranks' calls until a step (or every rank has joined); refused while a ModelAverager or "
     "PostLocalSGDOptimizer wraps the optimizer, on every rank of the averaging's world (docs/local_sgd.md)"},
    {GateCall::add_param_group, "add_param_group", kBetweenRounds, kDrainGathers | kDrainSaveReads, Leaves::idle,
     false, "re-lays out the buffers: the round's gradients are dropped"},
    {GateCall::set_trainable, "set_trainable", kBetweenRounds, kDrainGathers | kDrainSaveReads, Leaves::idle, false,
     "re-lays out the buffers: the round's gradients are dropped"},
    {GateCall::save, "save", kBetweenRounds, kDrainGathers | kDrainSaveCommit, Leaves::unchanged, false,
     "parameters, state and step counts of the last finished step"},
    {GateCall::save_async, "save_async", kBetweenRounds, kDrainGathers | kDrainSaveCommit, Leaves::unchanged, false,
     "as save; the next call that changes what it reads waits for its reading"},
    {GateCall::wait_save, "wait_save", kBetweenRounds | kOpen | kReduced | kUpdated, kDrainSaveCommit,
     Leaves::unchanged, false, "commits a pending save_async (touches no buffer)"},
    {GateCall::load, "load", kBetweenRounds, kDrainGathers | kDrainSaveCommit, Leaves::idle, false,
     "replaces parameters and state"},
    {GateCall::load_state_dict, "load_state_dict", kBetweenRounds, kDrainGathers | kDrainSaveReads, Leaves::idle,
     false, "replaces the state"},
    {GateCall::consolidate_state_dict, "consolidate_state_dict", kBetweenRounds, kDrainGathers, Leaves::unchanged,
     false, "gathers the state of the last finished step"},
    {GateCall::average_parameters, "average_parameters", kBetweenRounds, kDrainGathers | kDrainSaveReads,
     Leaves::unchanged, false, "replaces parameters with their average over the replicas"},
    {GateCall::replica_checkpoint, "replica checkpoint", kBetweenRounds, kDrainGathers | kDrainSaveReads,
     Leaves::unchanged, false, "saves or loads the local-SGD replicas and the outer optimizer"},
    {GateCall::attach_averager, "attach averager", kBetweenRounds, kDrainGathers, Leaves::unchanged, false,
     "agrees on the averaging config over the world; the outer optimizer's anchor reads the values"},
    {GateCall::average_gradients, "average gradients", kBetweenRounds | kOpen, kDrainNothing, Leaves::unchanged,
     false,
     "post-local SGD's warmup averages each gradient across the replicas before handing it to the reduction "
     "(refused at construction with overlap, whose thread reduces the same buffers)"},
};

void complete_pending_save(ZeroOptimizer::Impl& im) {
  if (!im.async_save.pending()) return;
  agree(im, continue_record("wait_save"));
  im.async_save.finish(im.dev.host_comm());
}

std::string states_text(unsigned states) {
  std::string text;
  for (int s = 0; s < kRoundStates; ++s) {
    if ((states & (1u << s)) == 0) continue;
    text += (text.empty() ? "" : ", ") + std::string(round_state_name(static_cast<RoundState>(s)));
  }
  return text;
}

std::string drains_text(unsigned drains) {
  std::string text;
  const auto add = [&](unsigned flag, const char* what) {
    if ((drains & flag) != 0) text += (text.empty() ? "" : ", ") + std::string(what);
  };
  add(kDrainSaveCommit, "pending save committed");
  add(kDrainGathers, "all-gathers landed");
  add(kDrainSaveReads, "save's reading done");
  add(kDrainSaveReadsPerBucket, "save's reading done (per_bucket)");
  return text.empty() ? "nothing" : text;
}

const char* leaves_text(Leaves leaves) {
  switch (leaves) {
    case Leaves::unchanged: return "unchanged";
    case Leaves::idle: return "idle";
    case Leaves::round_open: return "round_open";
    case Leaves::after_reduction: return "reduced (per_bucket: buckets_updated)";
  }
  return "?";
}

}  // namespace

const char* round_state_name(RoundState state) {
  switch (state) {
    case RoundState::idle: return "idle";
    case RoundState::round_open: return "round_open";
    case RoundState::reduced: return "reduced";
    case RoundState::buckets_updated: return "buckets_updated";
  }
  return "?";
}

const std::vector<CallRule>& rules() { return kRules; }

const CallRule& rule(GateCall call) {
  for (const CallRule& r : kRules) {
    if (r.call == call) return r;
  }
  raise(ErrorCode::internal, "round gate: no rule for call {}", static_cast<int>(call));
}

RoundState round_state(const ZeroOptimizer::Impl& im) {
  if (im.overlap.round_open() || im.reducer.round_started()) return RoundState::round_open;
  if (im.overlap.buckets_updated()) return RoundState::buckets_updated;
  return im.gate.reduced ? RoundState::reduced : RoundState::idle;
}

void check_legal(const ZeroOptimizer::Impl& im, GateCall call, const std::string& operation) {
  // A rank out of inputs shadows its optimizer's collectives only: the averaging across
  // replicas would wait for it (or average a replica that stopped training). Refused where it
  // is called, before anything is shadowed; the refusal then travels to every rank of the
  // averaging's world (relay_join_refusal), so none is left waiting for this one.
  SHARDOPT_CHECK(call != GateCall::join || im.gate.averagers.empty(), unsupported,
                 "{}: {} (rank {} called join()): this optimizer is wrapped by a ModelAverager or "
                 "PostLocalSGDOptimizer, whose averaging across the replicas has no way to shadow a rank out of "
                 "inputs; every rank of the averaging's world raises this error in its next call that meets this "
                 "rank's replica or averaging group; give every rank the same number of steps",
                 operation, kJoinRefusal, im.gate.averaging_world_rank);
  const RoundState state = round_state(im);
  if ((rule(call).from & bit(state)) != 0) return;
  switch (state) {
    case RoundState::round_open:
      raise(ErrorCode::invalid_argument,
            "{}: gradients were handed with grad_ready()/reduce_gradient() but the round was not finished with "
            "reduce_gradients()",
            operation);
    case RoundState::buckets_updated:
      raise(ErrorCode::invalid_argument,
            "{}: config.overlap = per_bucket has already updated this round's buckets in reduce_gradients(), and "
            "step() has not yet finished the round; call step() first",
            operation);
    default:
      raise(ErrorCode::invalid_argument, "{}: not allowed while the gradient round is {} (allowed from: {})",
            operation, round_state_name(state), states_text(rule(call).from));
  }
}

comm::AgreementRecord enter(ZeroOptimizer::Impl& im, GateCall call, std::string operation) {
  const CallRule& r = rule(call);
  if (operation.empty()) operation = r.name;
  if ((r.drains & kDrainSaveCommit) != 0) complete_pending_save(im);
  if ((r.drains & kDrainGathers) != 0) im.overlap.wait_all();
  if ((r.drains & kDrainSaveReads) != 0 || ((r.drains & kDrainSaveReadsPerBucket) != 0 && im.overlap.per_bucket())) {
    im.async_save.wait_for_sources();
  }
  comm::AgreementRecord record(operation);
  record.validate([&] { check_legal(im, call, operation); });
  return record;
}

comm::AgreementRecord continue_record(std::string operation) { return comm::AgreementRecord(std::move(operation)); }

std::vector<comm::Payload> agree(ZeroOptimizer::Impl& im, const comm::AgreementRecord& record) {
  try {
    return comm::agree(im.dev.host_comm(), record);
  } catch (const Error& e) {
    relay_join_refusal(im, e);
    throw;
  }
}

comm::Agreed agree_joinable(ZeroOptimizer::Impl& im, const comm::AgreementRecord& record) {
  try {
    return comm::agree_with_joined(im.dev.host_comm(), record);
  } catch (const Error& e) {
    relay_join_refusal(im, e);
    throw;
  }
}

bool is_join_refusal(const Error& e) {
  return e.code() == ErrorCode::unsupported && std::string(e.what()).find(kJoinRefusal) != std::string::npos;
}

void relay_join_refusal(ZeroOptimizer::Impl& im, const Error& e) {
  if (!is_join_refusal(e)) return;
  for (const auto& averager : im.gate.averagers) averager.second(e);
}

void leave(ZeroOptimizer::Impl& im, GateCall call) {
  const Leaves leaves = rule(call).leaves;
  RoundState expected = round_state(im);
  switch (leaves) {
    case Leaves::unchanged: return;
    case Leaves::idle:
      im.gate.reduced = false;
      expected = RoundState::idle;
      break;
    case Leaves::round_open: expected = RoundState::round_open; break;
    case Leaves::after_reduction:
      im.gate.reduced = true;
      expected = im.overlap.per_bucket() ? RoundState::buckets_updated : RoundState::reduced;
      break;
  }
  const RoundState now = round_state(im);
  SHARDOPT_CHECK(now == expected, internal, "round gate: {}() left the round {}, its rule says {}", rule(call).name,
                 round_state_name(now), round_state_name(expected));
}

void forget_round(ZeroOptimizer::Impl& im) {
  im.reducer.reset();
  im.overlap.reset();
  im.step.release_round_hyperparams();
  im.gate.reduced = false;
}

void raise_within(const char* operation, const Error& e) {
  const std::string what = e.what();
  if ((e.code() != ErrorCode::comm && e.code() != ErrorCode::timeout) || what.rfind(operation, 0) == 0) throw e;
  raise(e.code(), "{}: {}", operation, what);
}

std::string rules_markdown() {
  std::string text =
      "| call | may start from | drains first | leaves | shadowed in join() | why |\n"
      "|---|---|---|---|---|---|\n";
  for (const CallRule& r : kRules) {
    text += fmt::format("| `{}()` | {} | {} | {} | {} | {} |\n", r.name, states_text(r.from), drains_text(r.drains),
                        leaves_text(r.leaves), r.shadowed ? "yes" : "no (refused)", r.note);
  }
  return text;
}

}  // namespace optim
}  // namespace shardopt
