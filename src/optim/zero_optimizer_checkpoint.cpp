// src/optim/zero_optimizer_checkpoint.cpp — ZeroOptimizer's checkpoints and state dicts: the gate and the agreement here, the file and state work in src/checkpoint.
#include "checkpoint/optimizer_parts.hpp"
#include "core/check.hpp"
#include "optim/agreement_fields.hpp"
#include "optim/round_gate.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {

using comm::AgreementRecord;
using optim::GateCall;

namespace {

checkpoint::OptimizerParts parts_of(ZeroOptimizer::Impl& im) {
  return checkpoint::OptimizerParts{im.config, im.dev, im.table, im.shard, im.step, im.staging};
}

}  // namespace

void ZeroOptimizer::save(const std::string& dir) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::save);
  record.validate([&] { optim::refuse_q8_on_device(im.table, "save"); });
  optim::agree(im, record);
  im.shard.materialise_masters();
  checkpoint::save_checkpoint(parts_of(im), dir);
} catch (const Error& e) {
  optim::raise_within("save", e);
}

void ZeroOptimizer::save_async(const std::string& dir) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::save_async);
  record.validate([&] { optim::refuse_q8_on_device(im.table, "save_async"); });
  optim::agree(im, record);
  im.shard.materialise_masters();
  checkpoint::SaveTicket ticket = checkpoint::start_save(parts_of(im), dir);
  // The writer runs beside the caller's threads: one thread to widen bf16/f16 values.
  ticket.widen_threads = 1;
  im.async_save.start(std::move(ticket));
} catch (const Error& e) {
  optim::raise_within("save_async", e);
}

void ZeroOptimizer::wait_save() try {
  // Legal in every state: entering commits a pending save, and the record has nothing to agree.
  optim::enter(*impl_, GateCall::wait_save);
} catch (const Error& e) {
  optim::raise_within("wait_save", e);
}

void ZeroOptimizer::load(const std::string& dir) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::load);
  record.validate([&] { optim::refuse_q8_on_device(im.table, "load"); });
  optim::agree(im, record);
  checkpoint::load_checkpoint(parts_of(im), dir);
  optim::forget_round(im);
  im.sync.sync();
  optim::leave(im, GateCall::load);
} catch (const Error& e) {
  optim::raise_within("load", e);
}

void ZeroOptimizer::consolidate_state_dict(int to) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::consolidate_state_dict);
  record.field("target rank", fmt::format("{}", to));
  record.validate([&] {
    SHARDOPT_CHECK(to >= 0 && to < im.dev.world(), invalid_argument,
                   "consolidate_state_dict: target rank {} is out of range (world size {})", to, im.dev.world());
    optim::refuse_q8_on_device(im.table, "consolidate_state_dict");
  });
  optim::agree(im, record);
  im.shard.materialise_masters();
  std::optional<StateDict> dict = checkpoint::gather_state_dict(parts_of(im), to);
  // Only the target rank keeps the gathered state; the others drop any earlier one.
  im.consolidated = std::move(dict);
} catch (const Error& e) {
  optim::raise_within("consolidate_state_dict", e);
}

StateDict ZeroOptimizer::state_dict() const {
  SHARDOPT_CHECK(impl_->consolidated.has_value(), invalid_argument,
                 "state_dict(): rank {} holds no consolidated state; call consolidate_state_dict(to) on every rank "
                 "first and state_dict() on rank `to`",
                 impl_->dev.rank());
  StateDict dict = *impl_->consolidated;
  dict.param_groups = checkpoint::current_groups(impl_->table);
  return dict;
}

void ZeroOptimizer::load_state_dict(const StateDict& state) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, GateCall::load_state_dict);
  record.validate([&] {
    optim::refuse_q8_on_device(im.table, "load_state_dict");
    checkpoint::check_state_dict(parts_of(im), state);
  });
  record.field("state dict algorithm", algorithm_name(state.algorithm));
  record.field("state dict parameters", fmt::format("{}", state.param_names.size()));
  record.field("state dict entries", fmt::format("{}", state.state.size()));
  record.field("state dict contents", fmt::format("hash {:#018x}", checkpoint::content_hash(state)));
  for (std::size_t g = 0; g < state.param_groups.size(); ++g) {
    optim::add_group_fields(state.param_groups[g].hyper, static_cast<int>(g), record);
  }
  optim::agree(im, record);
  checkpoint::install_state_dict(parts_of(im), state);
  optim::leave(im, GateCall::load_state_dict);
} catch (const Error& e) {
  optim::raise_within("load_state_dict", e);
}

}  // namespace shardopt
