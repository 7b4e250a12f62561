// src/optim/round_gate.hpp — the optimizer's round state machine, and the one entry every collective call of every surface goes through.
//
// Every collective call of the optimizer (its own methods, and through them the C ABI, Python
// and the torch drop-in; Join's shadowing; averaging and its replica checkpoints) starts with
// enter(): it drains what the call needs drained (the last step's all-gathers, a background
// save's reading or its commit), checks that the call is legal in the current round state and
// starts the call's agreement record. An illegal call therefore fails inside the agreement, on
// every rank, with the same named error and nothing changed. The call adds its own fields,
// agrees through agree()/agree_joinable(), does its work and ends with leave(), which checks that
// it left the state the table documents. The table (round_gate.cpp, kRules) is the one place the
// legal transitions are written; docs/round_gate.md is generated from it (rules_markdown()) and a
// unit test keeps the two equal.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/agreement.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// Where the gradient round stands.
enum class RoundState {
  idle,             // no round: the next gradients are not handed yet
  round_open,       // gradients being handed (grad_ready/reduce_gradient); reduce_gradients() not yet called
  reduced,          // reduce_gradients() averaged the gradients; step() not yet called
  buckets_updated,  // per_bucket: reduce_gradients() updated every bucket; only step() may finish the round
};
constexpr int kRoundStates = 4;
const char* round_state_name(RoundState state);

// The calls that go through the gate (one row of the table each).
enum class GateCall {
  construct,      // the constructor's agreement on the config and the first groups
  hand_gradient,  // reduce_gradient(), grad_ready(): opens a round or continues it
  reduce_gradients,
  clip_grad_norm,
  step,
  join,  // join_step(): a rank out of inputs shadows the active ranks' calls
  add_param_group,
  set_trainable,
  save,
  save_async,
  wait_save,
  load,
  load_state_dict,
  consolidate_state_dict,
  average_parameters,  // ModelAverager / PostLocalSGD: parameters averaged across replicas
  replica_checkpoint,  // save/load of the local-SGD replicas and the outer optimizer
  attach_averager,     // a ModelAverager or PostLocalSGDOptimizer built over the optimizer
  average_gradients,   // post-local SGD's warmup: gradients averaged across replicas before the reduction
};

// The state a call leaves when it succeeds.
enum class Leaves {
  unchanged,        // the state it found
  idle,
  round_open,
  after_reduction,  // reduced, or buckets_updated under per_bucket
};

// What a call needs drained before it may look at or change the optimizer's buffers.
enum Drain : unsigned {
  kDrainNothing = 0,
  kDrainGathers = 1u << 0,      // the overlapped all-gathers (and queued bucket work) land first
  kDrainSaveReads = 1u << 1,    // a background save has read the values this call changes
  kDrainSaveCommit = 1u << 2,   // a pending background save is committed (collective: wait_save)
  kDrainSaveReadsPerBucket = 1u << 3,  // kDrainSaveReads under per_bucket (which updates in the round)
};

struct CallRule {
  GateCall call;
  const char* name;    // as messages print it: "step" -> "step()"
  unsigned from;       // bit (1 << RoundState) for each state the call may start from
  unsigned drains;     // Drain bits
  Leaves leaves;
  bool shadowed;       // a rank in join() follows it (the others are refused while one is)
  const char* note;    // why, for the docs
};
const std::vector<CallRule>& rules();
const CallRule& rule(GateCall call);

// The gate's own memory: the rest of the state is read from the parts (gradient reducer,
// overlap engine, background save), so the two cannot disagree.
struct RoundGate {
  bool reduced = false;   // reduce_gradients() finished and no step() since
  // The ModelAverager / PostLocalSGDOptimizer objects wrapping the optimizer (keyed by their
  // averaging port), each with its relay of a Join refusal (see relay_join_refusal), and this
  // rank's rank in the averaging's world (which the refusal names).
  std::vector<std::pair<const void*, std::function<void(const Error&)>>> averagers;
  int averaging_world_rank = -1;
};

// join() while an averager wraps the optimizer is refused (Error(unsupported)) with a message
// holding this text; the averaging's relays recognise it in the errors other ranks raise.
constexpr const char* kJoinRefusal = "Join does not combine with model averaging";
bool is_join_refusal(const Error& e);
// A Join refusal this rank raises out of one of the optimizer's agreements (its own join(), or
// a replica peer's carried into this rank's call) is handed to every attached averager's relay
// before it propagates: the averaging's other communicators carry it to the rest of the world,
// whose ranks would otherwise wait there for this one. Other errors pass untouched.
void relay_join_refusal(ZeroOptimizer::Impl& im, const Error& e);

// The current state, read from the parts and the gate.
RoundState round_state(const ZeroOptimizer::Impl& im);
// Error(invalid_argument) naming `operation` and why it may not run in the current state.
void check_legal(const ZeroOptimizer::Impl& im, GateCall call, const std::string& operation);

// Drains what `call` needs, then starts its record (named `operation`, the call's name when
// empty); a call illegal here carries the error into the agreement, which raises it on every rank.
comm::AgreementRecord enter(ZeroOptimizer::Impl& im, GateCall call, std::string operation = {});
// A further record inside a call already entered (a round's order check, Join's next shadow,
// a pending save's commit): no drains, no legality check.
comm::AgreementRecord continue_record(std::string operation);
std::vector<comm::Payload> agree(ZeroOptimizer::Impl& im, const comm::AgreementRecord& record);
comm::Agreed agree_joinable(ZeroOptimizer::Impl& im, const comm::AgreementRecord& record);
// After the call's work: records the state it leaves (Error(internal) when the parts disagree
// with the table: a gate bug, never the caller's).
void leave(ZeroOptimizer::Impl& im, GateCall call);
// The layout, state or buffers were replaced (a load, a re-layout): no round survives it.
void forget_round(ZeroOptimizer::Impl& im);

// A comm or timeout error from inside a call, raised again with the call's name first.
[[noreturn]] void raise_within(const char* operation, const Error& e);

// The table as markdown: docs/round_gate.md quotes it and a test compares the two.
std::string rules_markdown();

}  // namespace optim
}  // namespace shardopt
