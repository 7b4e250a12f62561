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
  impl_->comm = std::move(comm);
  impl_->config = config;
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
  return TensorRef{impl_->param_data(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

TensorRef ZeroOptimizer::grad_view(ParamId id) const {
  const ParamRecord& p = impl_->param(id);
  return TensorRef{impl_->grad_data(static_cast<std::size_t>(id)), p.numel, p.dtype, p.device};
}

uint64_t ZeroOptimizer::layout_version() const { return impl_->layout_version; }

void ZeroOptimizer::zero_grad() {
  const device::ScopedDevice scope(impl_->device);
  if (impl_->on_device() && impl_->bucket_view()) {
    // One fill of the whole flat gradient buffer instead of a launch per parameter: it holds
    // exactly the parameters' gradients and zero padding.
    impl_->zero_bytes(impl_->flat_grads.data(), static_cast<std::size_t>(impl_->flat_grads.bytes()));
    return;
  }
  for (std::size_t i = 0; i < impl_->params.size(); ++i) {
    const int64_t n = impl_->params[i].numel;
    if (n > 0) impl_->zero_bytes(impl_->grad_data(i), static_cast<std::size_t>(n) * sizeof(float));
  }
}

void* ZeroOptimizer::cuda_stream() const { return impl_->stream; }

void ZeroOptimizer::reduce_gradients() { impl_->reduce_gradients(); }
void ZeroOptimizer::step() { impl_->step(); }

double ZeroOptimizer::step(const std::function<double()>& closure) {
  SHARDOPT_CHECK(static_cast<bool>(closure), invalid_argument, "step(closure): the closure is empty");
  const double loss = closure();
  impl_->step();
  return loss;
}

MemoryReport ZeroOptimizer::memory_report() const {
  MemoryReport report;
  for (const optim::FlatBuffer& s : impl_->state) report.state_bytes += s.bytes();
  report.param_buffer_bytes = impl_->flat_params.bytes() + impl_->sync_staging.bytes();
  report.grad_buffer_bytes = impl_->flat_grads.bytes() + impl_->grad_staging.bytes();
  report.shard_numel = impl_->own_shard().numel;
  report.trainable_numel = impl_->layout.trainable_numel;
  return report;
}

Communicator& ZeroOptimizer::communicator() const { return *impl_->comm; }
const OptimizerConfig& ZeroOptimizer::config() const { return impl_->config; }

}  // namespace shardopt
