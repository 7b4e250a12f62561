// src/optim/param_table.cpp — registration checks (names, buffers, one device, one dtype) and the table of params and groups.
#include "optim/param_table.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "optim/hyperparams.hpp"
#include "optim/muon_update.hpp"
#include "q8_state.hpp"

namespace shardopt {
namespace optim {
namespace {

// One flat buffer per optimizer: every parameter has the first one's dtype.
void check_param_dtype(const std::string& label, DType d, DeviceChoice& choice) {
  SHARDOPT_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, invalid_argument,
                 "parameter {} has an unknown dtype ({})", label, static_cast<int>(d));
  if (!choice.dtype_fixed) {
    choice.dtype_fixed = true;
    choice.dtype = d;
    choice.dtype_source = "parameter " + label;
  }
  SHARDOPT_CHECK(d == choice.dtype, unsupported,
                 "parameter {} is {}, but {} is {}: all parameters of an optimizer share one dtype "
                 "(use one optimizer per dtype)",
                 label, dtype_name(d), choice.dtype_source, dtype_name(choice.dtype));
}

void check_param_device(const std::string& label, Device d, DeviceChoice& choice, int rank) {
  SHARDOPT_CHECK(!d.is_cuda() || device::cuda_compiled_in(), unsupported,
                 "parameter {} is on {}, but this build has no CUDA support (configure shardopt "
                 "with SHARDOPT_WITH_CUDA=ON where the CUDA toolkit is installed)",
                 label, device_name(d));
  if (!choice.fixed) {
    const std::string unusable = device::unusable_reason(d);
    SHARDOPT_CHECK(unusable.empty(), cuda, "parameter {} is on {}, but rank {} cannot use it: {}", label,
                   device_name(d), rank, unusable);
    choice.fixed = true;
    choice.device = d;
    choice.source = "parameter " + label;
  }
  SHARDOPT_CHECK(d == choice.device, unsupported,
                 "parameter {} is on {}, but {} is on {}: all parameters of an optimizer must "
                 "live on one device, the communicator's device for a device communicator",
                 label, device_name(d), choice.source, device_name(choice.device));
}

void check_buffers(const std::string& label, const ParamSpec& p, Storage storage) {
  if (storage == Storage::bucket_view) {
    SHARDOPT_CHECK(p.grad.data == nullptr, invalid_argument,
                   "parameter {}: in bucket_view storage shardopt owns the gradient; leave grad.data null and "
                   "write into grad_view()",
                   label);
    return;
  }
  SHARDOPT_CHECK(p.param.data != nullptr || p.param.numel == 0, invalid_argument,
                 "parameter {}: external storage needs the parameter buffer (param.data is null)", label);
  SHARDOPT_CHECK(p.grad.data != nullptr || p.param.numel == 0, invalid_argument,
                 "parameter {}: external storage needs a gradient buffer (grad.data is null)", label);
  SHARDOPT_CHECK(p.grad.numel == p.param.numel && p.grad.dtype == p.param.dtype && p.grad.device == p.param.device,
                 invalid_argument,
                 "parameter {}: gradient ({} elements, {}, {}) does not match the parameter ({} elements, {}, {})",
                 label, p.grad.numel, dtype_name(p.grad.dtype), device_name(p.grad.device), p.param.numel,
                 dtype_name(p.param.dtype), device_name(p.param.device));
  if (p.param.device.is_cuda() && p.param.numel > 0) {
    device::check_cuda_pointer(p.param.device, p.param.data, fmt::format("parameter {}: param.data", label));
    device::check_cuda_pointer(p.param.device, p.grad.data, fmt::format("parameter {}: grad.data", label));
  }
}

// 8-bit moments are Adam's, cut in 256-element blocks of each parameter that a rank updates
// whole in one kernel call: what would cut a block, or needs state without an 8-bit form, is
// refused by name.
void check_q8(const OptimizerConfig& config, Algorithm algorithm, const Hyperparams& hyper, int group) {
  const std::string what = fmt::format("param group {}: state_precision = q8 (8-bit blockwise moments)", group);
  SHARDOPT_CHECK(algorithm == Algorithm::adam || algorithm == Algorithm::adamw, unsupported,
                 "{} is implemented for adam and adamw; this group runs {}, whose momentum keeps fp32 state", what,
                 algorithm_name(algorithm));
  SHARDOPT_CHECK(!config.shard_state || config.partition == PartitionStrategy::sorted_greedy, unsupported,
                 "{} needs partition = sorted_greedy, which keeps each parameter whole on one rank (flat cuts "
                 "parameters at equal shard boundaries, which may fall inside a 256-element block)",
                 what);
  SHARDOPT_CHECK(config.pipeline_chunk_bytes == 0, unsupported,
                 "{} cannot combine with pipeline_chunk_bytes ({}): the chunks would cut blocks", what,
                 config.pipeline_chunk_bytes);
  SHARDOPT_CHECK(config.overlap != OverlapPolicy::per_bucket, unsupported,
                 "{} cannot combine with overlap = per_bucket: buckets would cut blocks", what);
  SHARDOPT_CHECK(!hyper.amsgrad, unsupported, "{} cannot combine with amsgrad (max_exp_avg_sq has no 8-bit form)",
                 what);
}

// The group's state layout: its settings over the config's, checked against its own algorithm.
GroupStorage resolve_storage(const ParamGroupSpec& spec, const OptimizerConfig& config, Algorithm algorithm,
                             const Hyperparams& hyper, int group) {
  const GroupSettings& set = spec.settings;
  GroupStorage out;
  out.state_precision = set.state_precision.value_or(config.state_precision);
  out.master = set.master.value_or(config.master);
  const int precision = static_cast<int>(out.state_precision);
  SHARDOPT_CHECK(precision == 0 || precision == 1, invalid_argument,
                 "param group {}: state_precision {} is not fp32 or q8", group, precision);
  const int master = static_cast<int>(out.master);
  SHARDOPT_CHECK(master == 0 || master == 1, invalid_argument, "param group {}: master {} is not fp32 or remainder16",
                 group, master);
  if (out.state_precision == StatePrecision::q8) check_q8(config, algorithm, hyper, group);
  if (out.master == MasterStorage::remainder16) {
    SHARDOPT_CHECK(algorithm != Algorithm::muon, unsupported,
                   "param group {}: master = remainder16 is not implemented for muon (its update writes an fp32 "
                   "master); use master = fp32 for Muon groups",
                   group);
    SHARDOPT_CHECK(!config.stochastic_rounding, invalid_argument,
                   "param group {}: master = remainder16 cannot combine with config.stochastic_rounding (the "
                   "parameter is drawn independently of the master, so no 16-bit remainder reconstructs it); use "
                   "master = fp32",
                   group);
  }
  return out;
}

// remainder16 keeps the master in the parameter's own bits: bf16 host parameters only.
void check_master_storage(const std::string& label, const TensorRef& param, MasterStorage master, int group) {
  if (master != MasterStorage::remainder16) return;
  SHARDOPT_CHECK(param.dtype == DType::bf16, invalid_argument,
                 "param group {}: master = remainder16 needs bf16 parameters, but parameter {} is {} (f32 parameters "
                 "are their own master; f16's 10-bit mantissa leaves no 16-bit remainder that reconstructs an fp32 "
                 "master)",
                 group, label, dtype_name(param.dtype));
  SHARDOPT_CHECK(param.device.is_cpu(), unsupported,
                 "param group {}: master = remainder16 is implemented for CPU parameters only, but parameter {} is on "
                 "{}",
                 group, label, device_name(param.device));
}

}  // namespace

std::string describe(const ParamRecord& p) {
  const std::string shape = p.shape.empty() ? "" : fmt::format(", shape [{}]", fmt::join(p.shape, ", "));
  return fmt::format("'{}' (numel {}{}, {}, {}, group {})", p.name, p.numel, shape, dtype_name(p.dtype),
                     p.device.is_cpu() ? "cpu" : "cuda", p.group);
}

// The shape must describe numel elements; a Muon group takes matrices only (torch.optim.Muon
// refuses other parameters).
static void check_shape(const std::string& label, const ParamSpec& p, Algorithm algorithm, int group) {
  if (!p.shape.empty()) {
    int64_t product = 1;
    for (int64_t d : p.shape) {
      SHARDOPT_CHECK(d >= 0 && d <= partition::kMaxElements, invalid_argument,
                     "parameter {} has shape [{}]: a dimension outside [0, 2^56]", label, fmt::join(p.shape, ", "));
      product = d == 0 ? 0 : (product > partition::kMaxElements / d ? partition::kMaxElements + 1 : product * d);
    }
    SHARDOPT_CHECK(product == p.param.numel, invalid_argument,
                   "parameter {} has shape [{}] ({} elements) but numel {}", label, fmt::join(p.shape, ", "), product,
                   p.param.numel);
  }
  if (algorithm == Algorithm::muon && p.param.device.is_cuda()) {
    // Newton-Schulz on CUDA runs on cuBLAS, opened at run time: refused only where it cannot be.
    const std::string why = muon_cuda_unavailable_reason();
    SHARDOPT_CHECK(why.empty(), unsupported,
                   "parameter {} in param group {} (muon) is on {}, but Muon's Newton-Schulz cannot run there: {}",
                   label, group, device_name(p.param.device), why);
  }
  if (algorithm == Algorithm::muon) {
    SHARDOPT_CHECK(p.shape.size() == 2, invalid_argument,
                   "parameter {} in param group {} (muon) has shape [{}]: Muon updates 2-D parameters only (give "
                   "ParamSpec::shape as [rows, cols], or put the parameter in a group of another algorithm)",
                   label, group, p.shape.empty() ? fmt::format("{}", p.param.numel) : fmt::format("{}", fmt::join(p.shape, ", ")));
  }
}

Registration ParamTable::prepare(const std::vector<ParamGroupSpec>& specs, const OptimizerConfig& config,
                                 Device comm_device, const std::string& comm_label, int rank) const {
  Registration out;
  DeviceChoice& choice = out.choice;
  if (comm_device.is_cuda()) {
    choice.fixed = true;
    choice.device = comm_device;
    choice.source = comm_label;
  } else if (!params_.empty()) {
    choice.fixed = true;
    choice.device = device_;
    choice.source = fmt::format("parameter '{}'", params_.front().name);
  }
  if (!params_.empty()) {
    choice.dtype_fixed = true;
    choice.dtype = dtype_;
    choice.dtype_source = fmt::format("parameter '{}'", params_.front().name);
  }
  SHARDOPT_CHECK(!specs.empty(), invalid_argument, "the parameter list is empty");
  // Every parameter, frozen or not, takes room in a bucket view's buffer: the running total
  // of all of them must stay within what a layout holds (partition::kMaxElements).
  int64_t total = params_.empty() ? 0 : params_.back().first_index + params_.back().numel;
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const ParamGroupSpec& spec = specs[g];
    const int group_index = num_groups() + static_cast<int>(g);
    const Algorithm algorithm = spec.settings.algorithm.value_or(config.algorithm);
    const int algorithm_value = static_cast<int>(algorithm);
    SHARDOPT_CHECK(algorithm_value >= 0 && algorithm_value <= 3, invalid_argument,
                   "param group {}: settings.algorithm {} is not sgd, adam, adamw or muon", group_index, algorithm_value);
    const Hyperparams hyper = spec.hyper.resolve(defaults_for(algorithm));
    validate_hyperparams(hyper, algorithm, group_index);
    SHARDOPT_CHECK(!spec.params.empty(), invalid_argument, "param group {} has an empty parameter list", group_index);
    if (algorithm == Algorithm::muon) {
      // A matrix is updated whole, once all of its gradient is in: per_bucket would update it
      // when its first bucket lands.
      SHARDOPT_CHECK(config.overlap != OverlapPolicy::per_bucket, invalid_argument,
                     "param group {} runs Muon, which updates each matrix whole once all of its gradient is reduced; "
                     "config.overlap = per_bucket updates bucket by bucket (use after_backward)",
                     group_index);
    }
    out.groups.push_back(hyper);
    out.algorithms.push_back(algorithm);
    out.storage.push_back(resolve_storage(spec, config, algorithm, hyper, group_index));
    for (const ParamSpec& p : spec.params) {
      const std::size_t position = params_.size() + out.records.size();
      const std::string label = p.name.empty() ? fmt::format("#{}", position) : "'" + p.name + "'";
      SHARDOPT_CHECK(!p.name.empty(), invalid_argument, "parameter {} in group {} has no name", label, group_index);
      SHARDOPT_CHECK(p.param.numel >= 0, invalid_argument, "parameter {} has negative numel {}", label, p.param.numel);
      SHARDOPT_CHECK(p.param.numel <= partition::kMaxElements, invalid_argument,
                     "parameter {} has numel {}, more than the {} (2^56) elements shardopt lays out", label,
                     p.param.numel, partition::kMaxElements);
      // Both terms are within [0, 2^56]: the sum cannot overflow before it is compared.
      total += p.param.numel;
      SHARDOPT_CHECK(total <= partition::kMaxElements, invalid_argument,
                     "parameter {} brings the parameters' elements to {} in all, more than the {} (2^56) shardopt "
                     "lays out",
                     label, total, partition::kMaxElements);
      check_param_device(label, p.param.device, choice, rank);
      check_param_dtype(label, p.param.dtype, choice);
      check_buffers(label, p, config.storage);
      check_shape(label, p, algorithm, group_index);
      check_master_storage(label, p.param, out.storage.back().master, group_index);
      for (const ParamRecord& existing : params_) {
        SHARDOPT_CHECK(existing.name != p.name, invalid_argument, "parameter name '{}' is registered twice", p.name);
      }
      for (const ParamRecord& earlier : out.records) {
        SHARDOPT_CHECK(earlier.name != p.name, invalid_argument, "parameter name '{}' is registered twice", p.name);
      }
      ParamRecord r;
      r.name = p.name;
      r.numel = p.param.numel;
      r.dtype = p.param.dtype;
      r.device = p.param.device;
      r.group = group_index;
      r.shape = p.shape;
      r.user_param = p.param.data;
      r.user_grad = p.grad.data;
      out.records.push_back(std::move(r));
      out.initial_values.push_back(p.param.data);
    }
  }
  return out;
}

void ParamTable::append(Registration registration) {
  if (params_.empty()) {
    dtype_ = registration.choice.dtype;
    device_ = registration.choice.device;
  }
  for (const Hyperparams& h : registration.groups) groups_.push_back(h);
  for (const GroupStorage& g : registration.storage) storage_.push_back(g);
  for (Algorithm a : registration.algorithms) algorithms_.push_back(a);
  int64_t next_index = params_.empty() ? 0 : params_.back().first_index + params_.back().numel;
  for (ParamRecord& r : registration.records) {
    r.first_index = next_index;
    next_index += r.numel;
    params_.push_back(std::move(r));
  }
}

const ParamRecord& ParamTable::param(ParamId id) const {
  SHARDOPT_CHECK(id >= 0 && static_cast<std::size_t>(id) < params_.size(), invalid_argument,
                 "parameter id {} is out of range (0..{})", id, static_cast<int64_t>(params_.size()) - 1);
  return params_[static_cast<std::size_t>(id)];
}

ParamRecord& ParamTable::param(ParamId id) {
  return const_cast<ParamRecord&>(static_cast<const ParamTable&>(*this).param(id));
}

ParamId ParamTable::find(const std::string& name) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<ParamId>(i);
  }
  raise(ErrorCode::invalid_argument, "no parameter named '{}' is registered", name);
}

Hyperparams& ParamTable::group(int index) {
  SHARDOPT_CHECK(index >= 0 && index < num_groups(), invalid_argument, "param group {} does not exist (there are {})",
                 index, num_groups());
  return groups_[static_cast<std::size_t>(index)];
}

void refuse_q8_on_device(const ParamTable& table, const char* operation) {
  SHARDOPT_CHECK(!table.any_q8() || table.device().is_cpu(), unsupported,
                 "{}: a param group keeps state_precision = q8 (8-bit blockwise moments) for parameters on {}; "
                 "checkpoints and state dicts carry 8-bit moments of CPU parameters only so far",
                 operation, device_name(table.device()));
}

bool ParamTable::q8_moments(const ParamRecord& p) const {
  return storage(p.group).state_precision == StatePrecision::q8 && p.numel >= kernels::kQ8MinNumel;
}

bool ParamTable::any_q8() const {
  return std::any_of(storage_.begin(), storage_.end(),
                     [](const GroupStorage& g) { return g.state_precision == StatePrecision::q8; });
}

bool ParamTable::any_master(MasterStorage master) const {
  if (dtype_ == DType::f32) return false;
  return std::any_of(storage_.begin(), storage_.end(), [&](const GroupStorage& g) { return g.master == master; });
}

Algorithm ParamTable::algorithm(int index) const {
  SHARDOPT_CHECK(index >= 0 && index < num_groups(), invalid_argument, "param group {} does not exist (there are {})",
                 index, num_groups());
  return algorithms_[static_cast<std::size_t>(index)];
}

bool ParamTable::any_group_runs(Algorithm algorithm) const {
  return std::find(algorithms_.begin(), algorithms_.end(), algorithm) != algorithms_.end();
}

Hyperparams ParamTable::defaults_for(Algorithm algorithm) const {
  return defaults_explicit_ ? defaults_ : default_hyperparams(algorithm);
}

std::vector<partition::ParamInfo> ParamTable::infos() const {
  std::vector<partition::ParamInfo> infos;
  infos.reserve(params_.size());
  for (const ParamRecord& p : params_) {
    const auto g = static_cast<std::size_t>(p.group);
    infos.push_back(layout_info(p.numel, p.group, p.trainable, algorithms_[g], p.shape, groups_[g]));
  }
  return infos;
}

std::vector<partition::ParamInfo> ParamTable::infos_with(const Registration& added) const {
  std::vector<partition::ParamInfo> infos = this->infos();
  for (const ParamRecord& r : added.records) {
    const auto g = static_cast<std::size_t>(r.group - num_groups());
    infos.push_back(layout_info(r.numel, r.group, r.trainable, added.algorithms[g], r.shape, added.groups[g]));
  }
  return infos;
}

}  // namespace optim
}  // namespace shardopt
