// src/optim/zero_optimizer.cpp — ZeroOptimizer's public methods over its Impl (zero_optimizer_impl.hpp).
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {

using optim::ParamRecord;

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::sgd: return "sgd";
    case Algorithm::adam: return "adam";
    case Algorithm::adamw: return "adamw";
  }
  return "unknown";
}

const char* partition_name(PartitionStrategy partition) {
  switch (partition) {
    case PartitionStrategy::flat: return "flat";
    case PartitionStrategy::sorted_greedy: return "sorted_greedy";
  }
  return "unknown";
}

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<Communicator> comm, OptimizerConfig config,
                             std::vector<ParamGroupSpec> groups)
    : impl_(std::make_unique<Impl>()) {
  SHARDOPT_CHECK(comm != nullptr, invalid_argument, "ZeroOptimizer needs a communicator (got null)");
  SHARDOPT_CHECK(config.bucket_bytes > 0, invalid_argument, "bucket_bytes must be positive, got {}", config.bucket_bytes);
  SHARDOPT_CHECK(config.pipeline_chunk_bytes >= 0, invalid_argument, "pipeline_chunk_bytes must be >= 0, got {}",
                 config.pipeline_chunk_bytes);
  SHARDOPT_CHECK(config.stage == 1 || config.stage == 2, invalid_argument, "stage must be 1 or 2, got {}", config.stage);
  SHARDOPT_CHECK(config.stage == 1 || config.shard_state, invalid_argument,
                 "stage 2 shards gradients by the optimizer state's partition; it needs shard_state = true");
  const LossScaling& ls = config.loss_scaling;
  if (ls.enabled) {
    SHARDOPT_CHECK(std::isfinite(ls.init_scale) && ls.init_scale > 0, invalid_argument,
                   "loss_scaling.init_scale must be finite and > 0, got {}", ls.init_scale);
    SHARDOPT_CHECK(std::isfinite(ls.growth_factor) && ls.growth_factor > 1.0, invalid_argument,
                   "loss_scaling.growth_factor must be finite and > 1, got {}", ls.growth_factor);
    SHARDOPT_CHECK(std::isfinite(ls.backoff_factor) && ls.backoff_factor > 0 && ls.backoff_factor < 1.0,
                   invalid_argument, "loss_scaling.backoff_factor must be in (0, 1), got {}", ls.backoff_factor);
    SHARDOPT_CHECK(ls.growth_interval > 0, invalid_argument, "loss_scaling.growth_interval must be > 0, got {}",
                   ls.growth_interval);
    SHARDOPT_CHECK(std::isfinite(ls.min_scale) && ls.min_scale > 0 && ls.min_scale <= ls.init_scale,
                   invalid_argument, "loss_scaling.min_scale must be finite, > 0 and <= init_scale ({}), got {}",
                   ls.init_scale, ls.min_scale);
  }
  impl_->comm = std::move(comm);
  impl_->config = config;
  impl_->defaults = config.defaults.value_or(default_hyperparams(config.algorithm));
  impl_->scale = config.loss_scaling.enabled ? config.loss_scaling.init_scale : 1.0;
  impl_->attach_device_communicator();
  impl_->register_groups(groups, "ZeroOptimizer");
}

ZeroOptimizer::~ZeroOptimizer() = default;

int ZeroOptimizer::add_param_group(ParamGroupSpec group) {
  impl_->register_groups({std::move(group)}, "add_param_group");
  return static_cast<int>(impl_->groups.size()) - 1;
}

void ZeroOptimizer::set_trainable(ParamId id, bool trainable) {
  ParamRecord& p = impl_->param(id);
  if (p.trainable == trainable) return;
  p.trainable = trainable;
  // A param that is frozen holds no state; thawed, it starts afresh as torch's lazy state.
  p.step = 0;
  p.has_momentum_buffer = false;
  impl_->layout_dirty = true;
}

bool ZeroOptimizer::trainable(ParamId id) const { return impl_->param(id).trainable; }
int ZeroOptimizer::num_groups() const { return static_cast<int>(impl_->groups.size()); }
int ZeroOptimizer::num_params() const { return static_cast<int>(impl_->params.size()); }

Hyperparams& ZeroOptimizer::hyperparams(int group) {
  SHARDOPT_CHECK(group >= 0 && group < num_groups(), invalid_argument,
                 "param group {} does not exist (there are {})", group, num_groups());
  return impl_->groups[static_cast<std::size_t>(group)];
}
const Hyperparams& ZeroOptimizer::hyperparams(int group) const {
  return const_cast<ZeroOptimizer*>(this)->hyperparams(group);
}

const Hyperparams& ZeroOptimizer::defaults() const { return impl_->defaults; }

ParamId ZeroOptimizer::find_param(const std::string& name) const {
  for (std::size_t i = 0; i < impl_->params.size(); ++i) {
    if (impl_->params[i].name == name) return static_cast<ParamId>(i);
  }
  raise(ErrorCode::invalid_argument, "no parameter named '{}' is registered", name);
}

const std::string& ZeroOptimizer::param_name(ParamId id) const { return impl_->param(id).name; }
int ZeroOptimizer::param_group(ParamId id) const { return impl_->param(id).group; }
int64_t ZeroOptimizer::param_step(ParamId id) const { return impl_->param(id).step; }

int ZeroOptimizer::param_owner(ParamId id) const {
  impl_->param(id);
  if (impl_->layout_dirty) impl_->rebuild_layout();
  return impl_->layout.param_owner[static_cast<std::size_t>(id)];
}

TensorRef ZeroOptimizer::param_view(ParamId id) const {
  const ParamRecord& p = impl_->param(id);
  return TensorRef{impl_->param_ptr(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

TensorRef ZeroOptimizer::grad_view(ParamId id) const {
  const ParamRecord& p = impl_->param(id);
  SHARDOPT_CHECK(!(impl_->stage2() && impl_->bucket_view()), invalid_argument,
                 "grad_view('{}'): at stage 2 shardopt keeps only this rank's shard of the gradients; hand "
                 "each gradient with reduce_gradient() instead",
                 p.name);
  return TensorRef{impl_->grad_ptr(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

uint64_t ZeroOptimizer::layout_version() const { return impl_->layout_version; }

void ZeroOptimizer::zero_grad() {
  const device::ScopedDevice scope(impl_->device);
  // Stage 2 owns only the shard's averaged gradients (external buffers are the caller's too).
  impl_->zero_bytes(impl_->shard_grads.raw(), static_cast<std::size_t>(impl_->shard_grads.bytes()));
  if (impl_->stage2() && impl_->bucket_view()) return;
  if (impl_->on_device() && impl_->bucket_view()) {
    // One fill of the whole flat gradient buffer instead of a launch per parameter: it holds
    // exactly the parameters' gradients and zero padding.
    impl_->zero_bytes(impl_->flat_grads.raw(), static_cast<std::size_t>(impl_->flat_grads.bytes()));
    return;
  }
  for (std::size_t i = 0; i < impl_->params.size(); ++i) {
    const int64_t n = impl_->params[i].numel;
    if (n > 0) impl_->zero_bytes(impl_->grad_ptr(i), optim::span_bytes(n, impl_->dtype));
  }
}

void* ZeroOptimizer::cuda_stream() const { return impl_->stream; }

void ZeroOptimizer::reduce_gradients() { impl_->reduce_gradients(); }
void ZeroOptimizer::reduce_gradient(ParamId id, const TensorRef& grad) { impl_->reduce_gradient(id, grad); }

double ZeroOptimizer::clip_grad_norm(double max_norm, double norm_type) {
  return impl_->clip_grad_norm(max_norm, norm_type);
}

double ZeroOptimizer::loss_scale() const { return impl_->scale; }

void ZeroOptimizer::set_loss_scale(double scale) {
  SHARDOPT_CHECK(impl_->config.loss_scaling.enabled, invalid_argument,
                 "set_loss_scale: loss scaling is not enabled in this optimizer's config");
  SHARDOPT_CHECK(std::isfinite(scale) && scale > 0, invalid_argument,
                 "set_loss_scale: the scale must be finite and > 0, got {}", scale);
  impl_->scale = scale;
  impl_->growth_tracker = 0;
}

const StepReport& ZeroOptimizer::last_step() const { return impl_->report; }
void ZeroOptimizer::step() { impl_->step(); }

double ZeroOptimizer::step(const std::function<double()>& closure) {
  SHARDOPT_CHECK(static_cast<bool>(closure), invalid_argument, "step(closure): the closure is empty");
  const double loss = closure();
  impl_->step();
  return loss;
}

MemoryReport ZeroOptimizer::memory_report() const {
  MemoryReport report;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    (k == optim::kMaster ? report.master_bytes : report.state_bytes) += impl_->state[k].bytes();
  }
  report.param_bytes = impl_->flat_params.bytes();
  report.grad_bytes = impl_->flat_grads.bytes() + impl_->shard_grads.bytes();
  int64_t bucket_bytes = 0;
  for (const core::FlatBuffer& b : impl_->bucket_staging) bucket_bytes += b.bytes();
  report.buffer_bytes = impl_->sync_staging.bytes() + impl_->grad_staging.bytes() + bucket_bytes;
  report.shard_numel = impl_->own_shard().numel;
  report.trainable_numel = impl_->layout.trainable_numel;
  return report;
}

Communicator& ZeroOptimizer::communicator() const { return *impl_->comm; }
const OptimizerConfig& ZeroOptimizer::config() const { return impl_->config; }

}  // namespace shardopt
