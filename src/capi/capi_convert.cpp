// src/capi/capi_convert.cpp — the C ABI's structs into the C++ API's types and back: the optimizer config (each version of the struct), hyperparameters, raw and DLPack tensors, param groups; and fail_collectively.
#include "capi/capi_convert.hpp"

#include <cmath>

#include "comm/agreement.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {
namespace capi {

// shardopt_dtype and shardopt_device_kind are DType and Device::Kind, value for value.
static_assert(SHARDOPT_DTYPE_F32 == static_cast<int>(DType::f32) && SHARDOPT_DTYPE_BF16 == static_cast<int>(DType::bf16) &&
                  SHARDOPT_DTYPE_F16 == static_cast<int>(DType::f16),
              "shardopt_dtype mirrors shardopt::DType");
static_assert(SHARDOPT_DTYPE_BYTE == static_cast<int>(DType::byte), "shardopt_dtype mirrors shardopt::DType");
static_assert(SHARDOPT_DEVICE_CPU == static_cast<int>(Device::Kind::cpu) &&
                  SHARDOPT_DEVICE_CUDA == static_cast<int>(Device::Kind::cuda),
              "shardopt_device_kind mirrors shardopt::Device::Kind");

Hyperparams hyper_from(const shardopt_hyperparams& h) {
  Hyperparams result;
  result.lr = h.lr;
  result.beta1 = h.beta1;
  result.beta2 = h.beta2;
  result.eps = h.eps;
  result.weight_decay = h.weight_decay;
  result.momentum = h.momentum;
  result.dampening = h.dampening;
  result.nesterov = h.nesterov != 0;
  result.maximize = h.maximize != 0;
  result.amsgrad = h.amsgrad != 0;
  if (newer_than<v1::hyperparams>(&h)) {  // Muon's fields; an older struct reads as their defaults
    for (std::size_t i = 0; i < 3; ++i) result.ns_coefficients[i] = h.ns_coefficients[i];
    result.ns_steps = h.ns_steps;
    result.adjust_lr_fn = static_cast<MuonLrAdjust>(h.adjust_lr_fn);
  }
  return result;
}

void hyper_to(const Hyperparams& h, shardopt_hyperparams& out) {
  out.lr = h.lr;
  out.beta1 = h.beta1;
  out.beta2 = h.beta2;
  out.eps = h.eps;
  out.weight_decay = h.weight_decay;
  out.momentum = h.momentum;
  out.dampening = h.dampening;
  out.nesterov = h.nesterov ? 1 : 0;
  out.maximize = h.maximize ? 1 : 0;
  out.amsgrad = h.amsgrad ? 1 : 0;
  if (!newer_than<v1::hyperparams>(&out)) return;  // the caller's struct ends before Muon's fields
  for (std::size_t i = 0; i < 3; ++i) out.ns_coefficients[i] = h.ns_coefficients[i];
  out.ns_steps = h.ns_steps;
  out.adjust_lr_fn = static_cast<int32_t>(h.adjust_lr_fn);
}

void tensor_to(const TensorRef& ref, shardopt_tensor& out) {
  out.data = ref.data;
  out.numel = ref.numel;
  out.dtype = static_cast<shardopt_dtype>(ref.dtype);
  out.device_kind = ref.device.is_cuda() ? SHARDOPT_DEVICE_CUDA : SHARDOPT_DEVICE_CPU;
  out.device_index = ref.device.is_cuda() ? ref.device.index : 0;
}

TensorRef tensor_from_raw(const shardopt_tensor& t, const std::string& what) {
  const int dtype = raw_enum_value(t.dtype);
  const int kind = raw_enum_value(t.device_kind);
  if (dtype == SHARDOPT_DTYPE_BYTE) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: dtype {} (SHARDOPT_DTYPE_BYTE) is for collectives; a tensor is f32, "
         "bf16 or f16 (0..2)", what, dtype);
  }
  if (dtype < 0 || dtype > 2) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: dtype {} is not a shardopt_dtype (0..2)", what, dtype);
  if (kind < 0 || kind > 1) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: device_kind {} is not a shardopt_device_kind (0..1)", what, kind);
  }
  if (t.device_index < 0) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: device_index is negative ({})", what, t.device_index);
  if (t.numel < 0) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: numel is negative ({})", what, t.numel);
  TensorRef ref;
  ref.data = t.data;
  ref.numel = t.numel;
  ref.dtype = static_cast<DType>(dtype);
  ref.device = kind == SHARDOPT_DEVICE_CUDA ? Device::cuda(t.device_index) : Device::cpu();
  return ref;
}

namespace {

// The fields appended to shardopt_optimizer_config after its first version. Checked here as well
// as by ZeroOptimizer, so that a value refused on one rank fails the collective create on every
// rank (see fail_collectively) instead of leaving the others in the registration check.
void appended_config_from(const shardopt_optimizer_config* config, OptimizerConfig& result) {
  if (config->stage != 1 && config->stage != 2) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->stage is {}; it must be 1 (ZeRO-1) or 2 (ZeRO-2)", config->stage);
  }
  if (config->stage == 2 && config->shard_state == 0) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT,
         "config->stage is 2, which shards the gradients by the optimizer state's partition: it needs "
         "config->shard_state = 1");
  }
  result.stage = config->stage;
  result.stochastic_rounding = config->stochastic_rounding != 0;
  result.rounding_seed = config->rounding_seed;
  const shardopt_loss_scaling& ls = config->loss_scaling;
  LossScaling& out = result.loss_scaling;
  out.enabled = ls.enabled != 0;
  if (!out.enabled) return;  // the other fields are ignored, as in the C++ API
  if (!(std::isfinite(ls.init_scale) && ls.init_scale > 0)) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->loss_scaling.init_scale must be finite and > 0, got {}",
         ls.init_scale);
  }
  if (!(std::isfinite(ls.growth_factor) && ls.growth_factor > 1.0)) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->loss_scaling.growth_factor must be finite and > 1, got {}",
         ls.growth_factor);
  }
  if (!(std::isfinite(ls.backoff_factor) && ls.backoff_factor > 0 && ls.backoff_factor < 1.0)) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->loss_scaling.backoff_factor must be in (0, 1), got {}",
         ls.backoff_factor);
  }
  if (ls.growth_interval <= 0) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->loss_scaling.growth_interval must be > 0, got {}",
         ls.growth_interval);
  }
  if (!(std::isfinite(ls.min_scale) && ls.min_scale > 0 && ls.min_scale <= ls.init_scale)) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT,
         "config->loss_scaling.min_scale must be finite, > 0 and <= init_scale ({}), got {}", ls.init_scale,
         ls.min_scale);
  }
  out.init_scale = ls.init_scale;
  out.growth_factor = ls.growth_factor;
  out.backoff_factor = ls.backoff_factor;
  out.growth_interval = ls.growth_interval;
  out.min_scale = ls.min_scale;
}

// config->defaults, checked here so that a bad value fails the create on every rank (even when
// no group inherits it) with a message naming the field.
Hyperparams defaults_from(const shardopt_optimizer_config& config, Algorithm algorithm) {
  check_struct(config.defaults, "config->defaults", "shardopt_hyperparams");
  const Hyperparams defaults = hyper_from(*config.defaults);
  try {
    optim::validate_hyperparams(defaults, algorithm, 0);
  } catch (const Error& e) {
    // The check speaks of a group ("param group 0: invalid lr ..."): say which struct it was.
    std::string message = e.what();
    const std::string group_prefix = "param group 0: ";
    if (message.rfind(group_prefix, 0) == 0) message.erase(0, group_prefix.size());
    fail(status_from(e.code()), "config->defaults: {}", message);
  }
  return defaults;
}

bool raw_given(const shardopt_tensor& t) { return t.data != nullptr || t.numel != 0; }

// One buffer of a param, raw or DLPack (then remembered in `dlpack`, to be owned on success).
TensorRef buffer_from(const shardopt_tensor& raw, DLManagedTensorVersioned* dl, const std::string& what,
                      const char* raw_field, const char* dl_field, std::vector<DLManagedTensorVersioned*>& dlpack) {
  if (dl == nullptr) return tensor_from_raw(raw, what);
  if (raw_given(raw)) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}: both {} and {} are given; describe the buffer one way", what,
         raw_field, dl_field);
  }
  TensorRef ref = tensor_from_dlpack(*dl, what);
  dlpack.push_back(dl);
  return ref;
}

ParamSpec param_from(const shardopt_param_desc* desc, const std::string& where,
                     std::vector<DLManagedTensorVersioned*>& dlpack) {
  check_struct(desc, where.c_str(), "shardopt_param_desc");
  if (desc->name == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "{}.name is NULL", where);
  ParamSpec spec;
  spec.name = desc->name;
  const std::string label = fmt::format("parameter '{}' ({})", spec.name, where);
  spec.param = buffer_from(desc->param, desc->param_dlpack, label, "param", "param_dlpack", dlpack);
  spec.grad = buffer_from(desc->grad, desc->grad_dlpack, "gradient of " + label, "grad", "grad_dlpack", dlpack);
  if (newer_than<v1::param_desc>(desc) && desc->ndim != 0) {
    if (desc->ndim < 0 || desc->ndim > 64) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "{}.ndim is {}", where, desc->ndim);
    if (desc->shape == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "{}.shape is NULL but ndim is {}", where, desc->ndim);
    spec.shape.assign(desc->shape, desc->shape + desc->ndim);
  }
  return spec;
}

}  // namespace

OptimizerConfig config_from(const shardopt_optimizer_config* config) {
  OptimizerConfig result;
  if (config == nullptr) return result;
  check_struct(config, "config", "shardopt_optimizer_config");
  const int algorithm = raw_enum_value(config->algorithm);
  const int partition = raw_enum_value(config->partition);
  const int storage = raw_enum_value(config->storage);
  if (algorithm < 0 || algorithm > 3) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->algorithm is {}, not a shardopt_algorithm (0..3)", algorithm);
  }
  if (partition < 0 || partition > 1) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->partition is {}, not a shardopt_partition (0..1)", partition);
  }
  if (storage < 0 || storage > 1) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->storage is {}, not a shardopt_storage (0..1)", storage);
  }
  if (config->bucket_bytes <= 0) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->bucket_bytes must be positive, got {}", config->bucket_bytes);
  }
  if (config->threads < 0) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->threads must be >= 0, got {}", config->threads);
  }
  result.algorithm = static_cast<Algorithm>(algorithm);
  result.partition = static_cast<PartitionStrategy>(partition);
  result.storage = static_cast<Storage>(storage);
  result.shard_state = config->shard_state != 0;
  result.bucket_bytes = config->bucket_bytes;
  result.cpu_threads = config->threads;
  // The earlier header's struct ends at `threads`: the appended fields keep their defaults
  // (their bytes, if any, are that struct's tail padding and are not read).
  if (newer_than<v1::optimizer_config>(config)) appended_config_from(config, result);
  if (newer_than<v2::optimizer_config>(config) && config->defaults != nullptr) {
    result.defaults = defaults_from(*config, result.algorithm);
  }
  if (newer_than<v3::optimizer_config>(config)) result.node_shared_params = config->node_shared_params != 0;
  if (newer_than<v4::optimizer_config>(config)) {
    if (config->pipeline_chunk_bytes < 0) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->pipeline_chunk_bytes must be >= 0 (0: no pipelining), got {}",
           config->pipeline_chunk_bytes);
    }
    result.pipeline_chunk_bytes = config->pipeline_chunk_bytes;
  }
  if (newer_than<v5::optimizer_config>(config)) {
    result.divide_by_initial_world_size = config->divide_by_initial_world_size != 0;
  }
  if (newer_than<v6::optimizer_config>(config)) {
    const int64_t overlap = config->overlap;
    if (overlap < 0 || overlap > 2) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->overlap is {}, not a shardopt_overlap_policy (0..2)", overlap);
    }
    result.overlap = static_cast<OverlapPolicy>(overlap);
  }
  if (newer_than<v7::optimizer_config>(config)) {
    if (config->muon_precision != 0 && config->muon_precision != 1) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->muon_precision is {}, not a shardopt_matrix_precision (0..1)",
           config->muon_precision);
    }
    result.muon.precision = static_cast<MatrixPrecision>(config->muon_precision);
    result.muon.blas_threads = config->muon_blas_threads;  // validated with the config, on every rank
  }
  if (newer_than<v8::optimizer_config>(config)) {
    if (config->state_precision < 0 || config->state_precision > 1) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->state_precision is {}, not a shardopt_state_precision (0..1)",
           config->state_precision);
    }
    if (config->master < 0 || config->master > 1) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->master is {}, not a shardopt_master_storage (0..1)", config->master);
    }
    result.state_precision = static_cast<StatePrecision>(config->state_precision);
    result.master = static_cast<MasterStorage>(config->master);
  }
  return result;
}

ParamGroupSpec group_from(const shardopt_param_group_desc* group, const std::string& where,
                          std::vector<DLManagedTensorVersioned*>& dlpack) {
  check_struct(group, where.c_str(), "shardopt_param_group_desc");
  ParamGroupSpec spec;
  if (group->hyperparams != nullptr) {
    const std::string name = where + ".hyperparams";
    check_struct(group->hyperparams, name.c_str(), "shardopt_hyperparams");
    spec.hyper = hyper_from(*group->hyperparams);
  }
  if (newer_than<v1::param_group_desc>(group) && group->algorithm != -1) {
    // Out-of-range values are refused by the optimizer, on every rank together.
    const int64_t value = group->algorithm < -1 || group->algorithm > 1000 ? 1000 : group->algorithm;
    spec.settings.algorithm = static_cast<Algorithm>(static_cast<int32_t>(value));
  }
  if (group->num_params > 0 && group->params == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER, "{}.params is NULL but num_params is {}", where, group->num_params);
  }
  // An empty group is left to the optimizer, which refuses it on every rank together.
  for (std::size_t i = 0; i < group->num_params; ++i) {
    spec.params.push_back(param_from(&group->params[i], fmt::format("{}.params[{}]", where, i), dlpack));
  }
  return spec;
}

[[noreturn]] void fail_collectively(Communicator& comm, const char* what, std::exception_ptr local) {
  shardopt_status status = SHARDOPT_ERR_INTERNAL;
  std::string message = "an unknown exception";
  try {
    std::rethrow_exception(local);
  } catch (const StatusError& e) {
    status = e.status();
    message = e.what();
  } catch (const Error& e) {
    status = status_from(e.code());
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
  }
  // The same agreement the call itself would have started with, carrying this failure.
  comm::join_failed(comm, what, Error(error_code_from(status), message));
  std::rethrow_exception(local);
}

void adopt(shardopt_optimizer_s& handle, const std::vector<DLManagedTensorVersioned*>& dlpack) noexcept {
  for (DLManagedTensorVersioned* t : dlpack) handle.owned.emplace_back(t);
}

}  // namespace capi
}  // namespace shardopt
