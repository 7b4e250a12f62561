// src/optim/zero_optimizer.cpp — ZeroOptimizer's public methods: each collective one starts with the ranks' agreement, then drives the parts in data-flow order.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "checkpoint/optimizer_parts.hpp"
#include "comm/agreement.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "cpu/cpu_isa.hpp"
#include "optim/agreement_fields.hpp"
#include "optim/hyperparams.hpp"
#include "optim/join.hpp"
#include "optim/memory_budget.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {

using comm::AgreementRecord;
using optim::ParamRecord;

namespace {

checkpoint::OptimizerParts parts_of(ZeroOptimizer::Impl& im) {
  return checkpoint::OptimizerParts{im.config, im.dev, im.table, im.shard, im.step, im.staging};
}

// Each collective call's body is a function-try-block ending in this: a comm or timeout error
// from inside it (a collective that a dead, stuck or diverged peer failed, in the agreement or
// later) is raised again with the call's name first, so it says which optimizer call was cut
// short and not only which collective. Other errors pass unchanged.
[[noreturn]] void raise_within(const char* operation, const Error& e) {
  const std::string what = e.what();
  if ((e.code() != ErrorCode::comm && e.code() != ErrorCode::timeout) || what.rfind(operation, 0) == 0) throw e;
  raise(e.code(), "{}: {}", operation, what);
}

std::vector<comm::Payload> agree(ZeroOptimizer::Impl& im, const AgreementRecord& record) {
  return comm::agree(im.dev.host_comm(), record);
}

comm::Agreed agree_joinable(ZeroOptimizer::Impl& im, const AgreementRecord& record) {
  return comm::agree_with_joined(im.dev.host_comm(), record);
}

// The record a checkpoint call starts with: no open stage-2 round. With config.overlap the
// last step's queued all-gathers land first: they read the shard a load overwrites.
AgreementRecord checkpoint_call(ZeroOptimizer::Impl& im, const char* operation) {
  im.overlap.wait_all();
  AgreementRecord record(operation);
  record.validate([&] { optim::check_no_open_round(im, operation); });
  return record;
}

// Collective when a background save is pending: commits it first (wait_save's semantics).
void complete_pending_save(ZeroOptimizer::Impl& im) {
  if (!im.async_save.pending()) return;
  agree(im, AgreementRecord("wait_save"));
  im.async_save.finish(im.dev.host_comm());
}

// Collective: checks `specs` locally, agrees with the other ranks, then appends and re-lays out.
void register_groups(ZeroOptimizer::Impl& im, const std::vector<ParamGroupSpec>& specs, AgreementRecord& record) {
  im.async_save.wait_for_sources();  // the layout is rebuilt below
  optim::Registration added;
  const std::size_t first_id = im.table.size();
  const int first_group = im.table.num_groups();
  record.validate([&] {
    optim::check_no_open_round(im, record.operation().c_str());
    const std::string comm_label = fmt::format("the {} communicator", im.dev.comm().backend_name());
    added = im.table.prepare(specs, im.config, im.dev.comm().device(), comm_label, im.dev.rank());
    im.dev.adopt(added.choice.device);
    im.overlap.check_device_path();
    // Sizes the layout cannot hold, or buffers this machine cannot, fail every rank here.
    const optim::MemoryBudget budget =
        optim::registration_budget(im.config, im.table, added, im.dev.rank(), im.dev.world());
    optim::check_bucket_count(im.config, im.table, added, im.dev.world());
    if (!added.choice.device.is_cuda()) optim::check_budget(budget, optim::host_memory_bytes(), im.dev.rank());
  });
  if (!record.failed()) optim::add_registration_fields(added, first_id, first_group, record);
  agree(im, record);
  std::vector<const void*> initial = added.initial_values;
  im.table.append(std::move(added));
  im.shard.rebuild(initial, first_id);
  im.reducer.reset();
  im.overlap.reset();
}

// config.overlap: a round opens with a small agreement (it tells ranks in join() to hand
// zeros, and every rank which ranks contribute); per_bucket agrees on the step's
// hyperparameters, loss scale and layout here, since buckets are updated before step().
void open_overlapped_round(ZeroOptimizer::Impl& im, const char* operation, bool explicit_hand_over) {
  // per_bucket changes parameters and state from here on: a background save must have read them.
  if (im.overlap.per_bucket()) im.async_save.wait_for_sources();
  AgreementRecord record(operation);
  record.validate([&] { im.overlap.check_can_open(); });
  if (im.overlap.per_bucket()) {
    optim::add_step_fields(im, record);
    record.set_payload(optim::kStepStateHash, optim::step_state_hash(im));
  }
  const comm::Agreed agreed = agree_joinable(im, record);
  if (im.overlap.per_bucket()) optim::check_shadows_step_state(agreed);
  optim::prepare_reduction(im, agreed);
  im.overlap.open_round(agreed, explicit_hand_over);
}

// reduce_gradients() with config.overlap: the ranks agree on the order they completed the
// buckets in (the first round's is learned), then the rest is issued and, unless per_bucket,
// waited for.
void reduce_overlapped(ZeroOptimizer::Impl& im) {
  if (!im.overlap.round_open()) open_overlapped_round(im, "reduce_gradients", false);
  const optim::OverlapEngine::RoundEnd end = im.overlap.close_hand_over();
  AgreementRecord handed("reduce_gradients");
  handed.field("bucket hand-over order", end.order);
  if (end.failure) handed.fail(*end.failure);
  try {
    agree_joinable(im, handed);
    im.overlap.settle_round();
  } catch (...) {
    im.overlap.abandon_round();
    throw;
  }
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Communicator> comm, OptimizerConfig config,
                             std::vector<ParamGroupSpec> groups) {
  SHARDOPT_CHECK(comm != nullptr, invalid_argument, "ZeroOptimizer needs a communicator (got null)");
  impl_ = std::make_unique<Impl>(std::move(comm), config);
  AgreementRecord record("ZeroOptimizer");
  record.validate([&] { optim::validate_config(config); });
  // SHARDOPT_CPU_ISA naming an ISA this CPU lacks fails here, on every rank together, rather
  // than at the first kernel call of one rank.
  record.validate([] { kernels::active_cpu_isa(); });
  // config.overlap on a communicator that cannot be called from the communication thread.
  record.validate([&] {
    if (impl_->overlap_refused) throw *impl_->overlap_refused;
  });
  if (config.defaults) {
    record.validate([&] { optim::validate_hyperparams(*config.defaults, config.algorithm, "config.defaults"); });
  }
  optim::add_config_fields(config, record);
  if (record.failed()) {
    agree(*impl_, record);  // raises on every rank
  }
  register_groups(*impl_, groups, record);
}

ZeroOptimizer::~ZeroOptimizer() = default;

int ZeroOptimizer::add_param_group(ParamGroupSpec group) try {
  AgreementRecord record("add_param_group");
  register_groups(*impl_, {std::move(group)}, record);
  return impl_->table.num_groups() - 1;
} catch (const Error& e) {
  raise_within("add_param_group", e);
}

void ZeroOptimizer::set_trainable(ParamId id, bool trainable) try {
  Impl& im = *impl_;
  im.async_save.wait_for_sources();  // the layout is rebuilt below
  AgreementRecord record("set_trainable");
  std::string name;
  record.validate([&] {
    name = im.table.param(id).name;
    optim::check_no_open_round(im, "set_trainable");
  });
  record.field("set_trainable parameter", name.empty() ? fmt::format("#{}", id) : "'" + name + "'");
  record.field("set_trainable value", trainable ? "true" : "false");
  agree(im, record);
  ParamRecord& p = im.table.param(id);
  if (p.trainable == trainable) return;
  p.trainable = trainable;
  // A param that is frozen holds no state; thawed, it starts afresh as torch's lazy state.
  p.step = 0;
  p.has_momentum_buffer = false;
  im.shard.rebuild();
  im.reducer.reset();
  im.overlap.reset();
} catch (const Error& e) {
  raise_within("set_trainable", e);
}

bool ZeroOptimizer::trainable(ParamId id) const { return impl_->table.param(id).trainable; }
int ZeroOptimizer::num_groups() const { return impl_->table.num_groups(); }
int ZeroOptimizer::num_params() const { return static_cast<int>(impl_->table.size()); }
Hyperparams& ZeroOptimizer::hyperparams(int group) { return impl_->table.group(group); }
const Hyperparams& ZeroOptimizer::hyperparams(int group) const { return impl_->table.group(group); }
const Hyperparams& ZeroOptimizer::defaults() const { return impl_->table.defaults(); }
ParamId ZeroOptimizer::find_param(const std::string& name) const { return impl_->table.find(name); }
const std::string& ZeroOptimizer::param_name(ParamId id) const { return impl_->table.param(id).name; }
int ZeroOptimizer::param_group(ParamId id) const { return impl_->table.param(id).group; }
int64_t ZeroOptimizer::param_step(ParamId id) const { return impl_->table.param(id).step; }

int ZeroOptimizer::param_owner(ParamId id) const {
  impl_->table.param(id);  // range check
  return impl_->shard.layout().param_owner[static_cast<std::size_t>(id)];
}

TensorRef ZeroOptimizer::param_view(ParamId id) const {
  const ParamRecord& p = impl_->table.param(id);
  return TensorRef{impl_->shard.param_ptr(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

TensorRef ZeroOptimizer::grad_view(ParamId id) const {
  const ParamRecord& p = impl_->table.param(id);
  SHARDOPT_CHECK(!(impl_->shard.stage2() && impl_->shard.bucket_view()), invalid_argument,
                 "grad_view('{}'): at stage 2 shardopt keeps only this rank's shard of the gradients; hand each "
                 "gradient with reduce_gradient() instead",
                 p.name);
  return TensorRef{impl_->shard.grad_ptr(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

std::shared_ptr<const void> ZeroOptimizer::param_view_owner(ParamId id) const {
  const TensorRef view = param_view(id);
  if (!impl_->shard.bucket_view()) return nullptr;
  // Aliasing: owns the whole flat buffer, points at this view.
  return std::shared_ptr<const void>(impl_->shard.flat_params().keeper(), view.data);
}

std::shared_ptr<const void> ZeroOptimizer::grad_view_owner(ParamId id) const {
  const TensorRef view = grad_view(id);
  if (!impl_->shard.bucket_view()) return nullptr;
  return std::shared_ptr<const void>(impl_->shard.flat_grads().keeper(), view.data);
}

uint64_t ZeroOptimizer::layout_version() const { return impl_->shard.layout_version(); }

void ZeroOptimizer::zero_grad() {
  Impl& im = *impl_;
  const device::ScopedDevice scope(im.dev.device());
  // Stage 2 owns only the shard's averaged gradients (external buffers are the caller's too).
  im.dev.zero_bytes(im.shard.shard_grads().raw(), static_cast<std::size_t>(im.shard.shard_grads().bytes()));
  if (im.shard.stage2() && im.shard.bucket_view()) return;
  if (im.dev.on_device() && im.shard.bucket_view()) {
    // One fill of the whole flat gradient buffer instead of a launch per parameter: it holds
    // exactly the parameters' gradients and zero padding.
    im.dev.zero_bytes(im.shard.flat_grads().raw(), static_cast<std::size_t>(im.shard.flat_grads().bytes()));
    return;
  }
  for (std::size_t i = 0; i < im.table.size(); ++i) {
    const int64_t n = im.table.params()[i].numel;
    if (n > 0) im.dev.zero_bytes(im.shard.grad_ptr(i), optim::span_bytes(n, im.table.dtype()));
  }
}

void* ZeroOptimizer::cuda_stream() const { return impl_->dev.stream(); }

void ZeroOptimizer::reduce_gradients() try {
  Impl& im = *impl_;
  if (im.overlap.enabled()) {
    reduce_overlapped(im);
    return;
  }
  // Ranks in join() contribute zeros; the average divides by the ranks that contributed.
  optim::prepare_reduction(im, agree_joinable(im, AgreementRecord("reduce_gradients")));
  const uint64_t order = im.reducer.reduce_all();
  if (!im.shard.stage2()) return;
  // Buckets handed in another order on some rank were matched with the wrong collectives:
  // refuse the round on every rank rather than step on mixed-up gradients.
  AgreementRecord handed("reduce_gradients");
  handed.field("gradient hand-over order", fmt::format("the reduce_gradient() calls hashing to {:#018x}", order));
  agree_joinable(im, handed);
} catch (const Error& e) {
  raise_within("reduce_gradients", e);
}

void ZeroOptimizer::reduce_gradient(ParamId id, const TensorRef& grad) try {
  Impl& im = *impl_;
  if (im.overlap.enabled()) {
    if (!im.overlap.round_open()) open_overlapped_round(im, "reduce_gradient", true);
    im.overlap.hand(id, grad);
    return;
  }
  if (im.shard.stage2() && im.shard.bucket_view() && !im.reducer.round_started()) {
    // A round opens with a small agreement: it tells the ranks in join() to hand zeros, and
    // every rank which ranks contribute, before any bucket is reduced.
    optim::prepare_reduction(im, agree_joinable(im, AgreementRecord("reduce_gradient")));
  }
  im.reducer.hand(id, grad);
} catch (const Error& e) {
  raise_within("reduce_gradient", e);
}

void ZeroOptimizer::grad_ready(ParamId id) try {
  Impl& im = *impl_;
  const std::string& name = im.table.param(id).name;  // range check
  SHARDOPT_CHECK(im.shard.bucket_view(), invalid_argument,
                 "grad_ready('{}'): for gradients written into grad_view() (bucket view); with external storage "
                 "reduce_gradients() reads the registered gradient buffers",
                 name);
  SHARDOPT_CHECK(!im.shard.stage2(), invalid_argument,
                 "grad_ready('{}'): at stage 2 shardopt keeps only this rank's shard of the gradients; hand each "
                 "gradient with reduce_gradient()",
                 name);
  if (!im.overlap.enabled()) return;  // reduce_gradients() reads every gradient in place
  if (!im.overlap.round_open()) open_overlapped_round(im, "reduce_gradient", true);
  im.overlap.ready(id);
} catch (const Error& e) {
  raise_within("grad_ready", e);
}

void ZeroOptimizer::wait_param(ParamId id) { impl_->overlap.wait_param(id); }
void ZeroOptimizer::wait_bucket(int bucket) { impl_->overlap.wait_bucket(bucket); }
void ZeroOptimizer::wait_all() { impl_->overlap.wait_all(); }
int ZeroOptimizer::num_buckets() const { return impl_->overlap.num_buckets(); }

double ZeroOptimizer::clip_grad_norm(double max_norm, double norm_type) try {
  Impl& im = *impl_;
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  AgreementRecord record("clip_grad_norm");
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
    optim::check_no_open_round(im, "clip_grad_norm");
    // This rank's partial: a double and the inf/NaN flag, moved in the record's payload.
    const kernels::GradStats mine = im.step.local_grad_stats(inf_norm);
    record.set_payload(0, comm::double_bits(mine.value));
    record.set_payload(1, mine.nonfinite ? 1 : 0);
  });
  // The arguments ride along for the ranks in join(), which shadow this call.
  record.set_payload(2, comm::double_bits(max_norm));
  record.set_payload(3, comm::double_bits(norm_type));
  const comm::Agreed agreed = agree_joinable(im, record);
  return im.step.arm_clip(max_norm, inf_norm, optim::clip_parts(im, agreed, inf_norm));
} catch (const Error& e) {
  raise_within("clip_grad_norm", e);
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
  // A background save may still be reading the values this step changes (async_save.hpp).
  im.async_save.wait_for_sources();
  AgreementRecord record("step");
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
  record.validate([&] {
    // (per_bucket's updated buckets are what step() finishes: only the hand-over must be over.)
    im.reducer.check_no_open_round("step");
    im.overlap.check_hand_over_closed("step");
    record.set_payload(0, im.step.local_nonfinite() ? 1 : 0);
  });
  // For ranks in join(): how many params sit out, and the state they must step with.
  record.set_payload(1, sitting_out.size());
  record.set_payload(optim::kStepStateHash, optim::step_state_hash(im));
  const auto start = std::chrono::steady_clock::now();
  const comm::Agreed agreed = agree_joinable(im, record);
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
} catch (const Error& e) {
  raise_within("step", e);
}

bool ZeroOptimizer::join_step() try {
  return optim::shadow_until_step(*impl_);
} catch (const Error& e) {
  raise_within("join", e);
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

MemoryReport ZeroOptimizer::memory_report() const {
  const optim::ShardState& shard = impl_->shard;
  MemoryReport report;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    (k == optim::kMaster ? report.master_bytes : report.state_bytes) += shard.state()[k].bytes();
  }
  report.param_bytes = shard.flat_params().bytes();
  report.grad_bytes = shard.flat_grads().bytes() + shard.shard_grads().bytes();
  report.buffer_bytes = shard.sync_staging().bytes() + shard.grad_staging().bytes() + impl_->reducer.staging_bytes() +
                        impl_->overlap.staging_bytes();
  if (const comm::NodeTopology* nodes = shard.node_sharing()) {
    const int64_t shared = shard.shared_buffer().bytes();
    (shard.bucket_view() ? report.param_bytes : report.buffer_bytes) -= shared;
    report.node_shared_param_bytes = shared;
    report.node_ranks = nodes->node->size();
  }
  report.shard_numel = shard.own_shard().numel;
  report.trainable_numel = shard.layout().trainable_numel;
  return report;
}

// ---- checkpoints: the agreement here, the file and state work in src/checkpoint ----

void ZeroOptimizer::save(const std::string& dir) try {
  Impl& im = *impl_;
  complete_pending_save(im);
  agree(im, checkpoint_call(im, "save"));
  checkpoint::save_checkpoint(parts_of(im), dir);
} catch (const Error& e) {
  raise_within("save", e);
}

void ZeroOptimizer::save_async(const std::string& dir) try {
  Impl& im = *impl_;
  complete_pending_save(im);
  agree(im, checkpoint_call(im, "save_async"));
  checkpoint::SaveTicket ticket = checkpoint::start_save(parts_of(im), dir);
  // The writer runs beside the caller's threads: one thread to widen bf16/f16 values.
  ticket.widen_threads = 1;
  im.async_save.start(std::move(ticket));
} catch (const Error& e) {
  raise_within("save_async", e);
}

void ZeroOptimizer::wait_save() try {
  complete_pending_save(*impl_);
} catch (const Error& e) {
  raise_within("wait_save", e);
}

void ZeroOptimizer::load(const std::string& dir) try {
  Impl& im = *impl_;
  complete_pending_save(im);
  agree(im, checkpoint_call(im, "load"));
  checkpoint::load_checkpoint(parts_of(im), dir);
  im.reducer.reset();
  im.overlap.reset();
  im.sync.sync();
} catch (const Error& e) {
  raise_within("load", e);
}

void ZeroOptimizer::consolidate_state_dict(int to) try {
  Impl& im = *impl_;
  im.overlap.wait_all();  // as checkpoint_call: the queued work settles before state is read
  AgreementRecord record("consolidate_state_dict");
  record.field("target rank", fmt::format("{}", to));
  record.validate([&] {
    optim::check_no_open_round(im, "consolidate_state_dict");
    SHARDOPT_CHECK(to >= 0 && to < im.dev.world(), invalid_argument,
                   "consolidate_state_dict: target rank {} is out of range (world size {})", to, im.dev.world());
  });
  agree(im, record);
  std::optional<StateDict> dict = checkpoint::gather_state_dict(parts_of(im), to);
  // Only the target rank keeps the gathered state; the others drop any earlier one.
  im.consolidated = std::move(dict);
} catch (const Error& e) {
  raise_within("consolidate_state_dict", e);
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
  im.async_save.wait_for_sources();  // the state is replaced below
  AgreementRecord record = checkpoint_call(im, "load_state_dict");
  record.validate([&] { checkpoint::check_state_dict(parts_of(im), state); });
  record.field("state dict algorithm", algorithm_name(state.algorithm));
  record.field("state dict parameters", fmt::format("{}", state.param_names.size()));
  record.field("state dict entries", fmt::format("{}", state.state.size()));
  record.field("state dict contents", fmt::format("hash {:#018x}", checkpoint::content_hash(state)));
  for (std::size_t g = 0; g < state.param_groups.size(); ++g) {
    optim::add_group_fields(state.param_groups[g].hyper, static_cast<int>(g), record);
  }
  agree(im, record);
  checkpoint::install_state_dict(parts_of(im), state);
} catch (const Error& e) {
  raise_within("load_state_dict", e);
}

ZeroOptimizer::Impl& optimizer_internals(ZeroOptimizer& optimizer) { return *optimizer.impl_; }

Communicator& ZeroOptimizer::communicator() const { return impl_->dev.comm(); }
const OptimizerConfig& ZeroOptimizer::config() const { return impl_->config; }

}  // namespace shardopt
