// src/optim/zero_optimizer.cpp — ZeroOptimizer's construction, registration and local accessors (the round's calls: zero_optimizer_round.cpp; checkpoints: zero_optimizer_checkpoint.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "comm/agreement.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "cpu/blas_core.hpp"
#include "cpu/cpu_isa.hpp"
#include "optim/agreement_fields.hpp"
#include "optim/hyperparams.hpp"
#include "optim/round_gate.hpp"
#include "optim/memory_budget.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {

using comm::AgreementRecord;
using optim::ParamRecord;

namespace {

// Collective, `record` entered through the gate: checks `specs` locally, agrees with the other
// ranks, then appends and re-lays out.
void register_groups(ZeroOptimizer::Impl& im, const std::vector<ParamGroupSpec>& specs, AgreementRecord& record) {
  optim::Registration added;
  const std::size_t first_id = im.table.size();
  const int first_group = im.table.num_groups();
  record.validate([&] {
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
  optim::agree(im, record);
  std::vector<const void*> initial = added.initial_values;
  im.table.append(std::move(added));
  // Out of an OpenBLAS fallback core at registration, not at the first step: the trainer's own
  // BLAS calls then run on one core from here on, not on one before the first step and another after.
  if (im.table.any_group_runs(Algorithm::muon)) kernels::ensure_blas_core();
  im.shard.rebuild(initial, first_id);
  optim::forget_round(im);
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Communicator> comm, std::vector<ParamGroupSpec> groups,
                             OptimizerConfig config)
    : ZeroOptimizer(std::move(comm), std::move(config), std::move(groups)) {}

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Communicator> comm, OptimizerConfig config,
                             std::vector<ParamGroupSpec> groups) {
  SHARDOPT_CHECK(comm != nullptr, invalid_argument, "ZeroOptimizer needs a communicator (got null)");
  impl_ = std::make_unique<Impl>(std::move(comm), config);
  AgreementRecord record = optim::enter(*impl_, optim::GateCall::construct, "ZeroOptimizer");
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
    optim::agree(*impl_, record);  // raises on every rank
  }
  register_groups(*impl_, groups, record);
  optim::leave(*impl_, optim::GateCall::construct);
}

ZeroOptimizer::~ZeroOptimizer() = default;

int ZeroOptimizer::add_param_group(ParamGroupSpec group) try {
  AgreementRecord record = optim::enter(*impl_, optim::GateCall::add_param_group);
  register_groups(*impl_, {std::move(group)}, record);
  optim::leave(*impl_, optim::GateCall::add_param_group);
  return impl_->table.num_groups() - 1;
} catch (const Error& e) {
  optim::raise_within("add_param_group", e);
}

void ZeroOptimizer::set_trainable(ParamId id, bool trainable) try {
  Impl& im = *impl_;
  AgreementRecord record = optim::enter(im, optim::GateCall::set_trainable);
  std::string name;
  record.validate([&] {
    name = im.table.param(id).name;
  });
  record.field("set_trainable parameter", name.empty() ? fmt::format("#{}", id) : "'" + name + "'");
  record.field("set_trainable value", trainable ? "true" : "false");
  optim::agree(im, record);
  ParamRecord& p = im.table.param(id);
  if (p.trainable != trainable) {
    p.trainable = trainable;
    // A param that is frozen holds no state; thawed, it starts afresh as torch's lazy state.
    p.step = 0;
    p.has_momentum_buffer = false;
    im.shard.rebuild();
    optim::forget_round(im);
  }
  optim::leave(im, optim::GateCall::set_trainable);
} catch (const Error& e) {
  optim::raise_within("set_trainable", e);
}

bool ZeroOptimizer::trainable(ParamId id) const { return impl_->table.param(id).trainable; }
int ZeroOptimizer::num_groups() const { return impl_->table.num_groups(); }
int ZeroOptimizer::num_params() const { return static_cast<int>(impl_->table.size()); }
Hyperparams& ZeroOptimizer::hyperparams(int group) { return impl_->table.group(group); }
const Hyperparams& ZeroOptimizer::hyperparams(int group) const { return impl_->table.group(group); }
const Hyperparams& ZeroOptimizer::defaults() const { return impl_->table.defaults(); }
Algorithm ZeroOptimizer::group_algorithm(int group) const { return impl_->table.algorithm(group); }
const std::vector<int64_t>& ZeroOptimizer::param_shape(ParamId id) const { return impl_->table.param(id).shape; }
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
  const optim::ShardState& shard = impl_->shard;
  SHARDOPT_CHECK(!(shard.stage2() && shard.bucket_view()) || shard.stage2_grad_views(), invalid_argument,
                 "grad_view('{}'): at stage 2 shardopt keeps only this rank's shard of the gradients (a whole "
                 "gradient buffer only with node-shared parameters, on one node or, without overlap, on nodes of "
                 "equal size); "
                 "hand each gradient with reduce_gradient() instead",
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
  if (im.shard.stage2() && im.shard.bucket_view() && !im.shard.stage2_grad_views()) return;
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

MemoryReport ZeroOptimizer::memory_report() const {
  const optim::ShardState& shard = impl_->shard;
  MemoryReport report;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    (k == optim::kMaster ? report.master_bytes : report.state_bytes) += shard.state()[k].bytes();
  }
  report.master_bytes += shard.remainder_buffer().bytes();
  report.state_bytes += shard.q8_bytes();
  report.param_bytes = shard.flat_params().bytes();
  // Stage 2 on one node: the shard's gradients are positions of this rank's slot, counted once.
  report.grad_bytes = shard.flat_grads().bytes() + (shard.shard_grads().borrowed() ? 0 : shard.shard_grads().bytes());
  report.buffer_bytes = shard.sync_staging().bytes() + shard.grad_staging().bytes() + shard.hand_over_slot().bytes() +
                        impl_->reducer.staging_bytes() +
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

ZeroOptimizer::Impl& optimizer_internals(ZeroOptimizer& optimizer) { return *optimizer.impl_; }

Communicator& ZeroOptimizer::communicator() const { return impl_->dev.comm(); }
const OptimizerConfig& ZeroOptimizer::config() const { return impl_->config; }

}  // namespace shardopt
