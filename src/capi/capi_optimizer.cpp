// src/capi/capi_optimizer.cpp — the C functions over ZeroOptimizer: collective create from param-group arrays, views, gradient reduction, clipping, loss scaling, step, checkpoints.
#include <cmath>
#include <cstring>
#include <exception>

#include "capi/boundary.hpp"
#include "comm/agreement.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {
namespace capi {
namespace {

// A C enum field may hold any int the caller stored; loading it as the enum type would be
// undefined behaviour for values outside the enumerators, so its bytes are read as an int.
template <typename Enum>
int raw_enum_value(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized here");
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

// shardopt_dtype and shardopt_device_kind are DType and Device::Kind, value for value.
static_assert(SHARDOPT_DTYPE_F32 == static_cast<int>(DType::f32) && SHARDOPT_DTYPE_BF16 == static_cast<int>(DType::bf16) &&
                  SHARDOPT_DTYPE_F16 == static_cast<int>(DType::f16),
              "shardopt_dtype mirrors shardopt::DType");
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
  return result;
}

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

OptimizerConfig config_from(const shardopt_optimizer_config* config) {
  OptimizerConfig result;
  if (config == nullptr) return result;
  check_struct(config, "config", "shardopt_optimizer_config");
  const int algorithm = raw_enum_value(config->algorithm);
  const int partition = raw_enum_value(config->partition);
  const int storage = raw_enum_value(config->storage);
  if (algorithm < 0 || algorithm > 2) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config->algorithm is {}, not a shardopt_algorithm (0..2)", algorithm);
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
}

void tensor_to(const TensorRef& ref, shardopt_tensor& out) {
  out.data = ref.data;
  out.numel = ref.numel;
  out.dtype = static_cast<shardopt_dtype>(ref.dtype);
  out.device_kind = ref.device.is_cuda() ? SHARDOPT_DEVICE_CUDA : SHARDOPT_DEVICE_CPU;
  out.device_index = ref.device.is_cuda() ? ref.device.index : 0;
}

bool raw_given(const shardopt_tensor& t) { return t.data != nullptr || t.numel != 0; }

TensorRef tensor_from_raw(const shardopt_tensor& t, const std::string& what) {
  const int dtype = raw_enum_value(t.dtype);
  const int kind = raw_enum_value(t.device_kind);
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
  return spec;
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
  if (group->num_params > 0 && group->params == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER, "{}.params is NULL but num_params is {}", where, group->num_params);
  }
  // An empty group is left to the optimizer, which refuses it on every rank together.
  for (std::size_t i = 0; i < group->num_params; ++i) {
    spec.params.push_back(param_from(&group->params[i], fmt::format("{}.params[{}]", where, i), dlpack));
  }
  return spec;
}

// This rank failed before the collective registration check `what` that the other ranks are
// entering: take part in it with the failure, so that they fail too (naming this rank) instead
// of waiting, then rethrow the failure here.
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
  try {
    // The same agreement the call itself would have started with, carrying this failure.
    comm::AgreementRecord record(what);
    record.fail(Error(error_code_from(status), message));
    comm::agree(comm, record);
  } catch (...) {
    // It rethrows this rank's own failure (or a communication error): report the original.
  }
  std::rethrow_exception(local);
}

// Takes ownership of the DLPack tensors a successful call consumed: cannot throw (the space was
// reserved before the call), so the caller never loses a tensor it still thinks is its own.
void adopt(shardopt_optimizer_s& handle, const std::vector<DLManagedTensorVersioned*>& dlpack) noexcept {
  for (DLManagedTensorVersioned* t : dlpack) handle.owned.emplace_back(t);
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;
using shardopt::ParamGroupSpec;

extern "C" {

shardopt_status shardopt_optimizer_create(shardopt_comm_t comm, const shardopt_optimizer_config* config,
                                          const shardopt_param_group_desc* groups, size_t num_groups,
                                          shardopt_optimizer_t* out) {
  return guard("shardopt_optimizer_create", [&] {
    // Without a usable communicator the other ranks cannot be told: fail here alone.
    shardopt_comm_s& c = checked_comm(comm, "comm");
    shardopt::OptimizerConfig cfg;
    std::vector<ParamGroupSpec> specs;
    std::vector<DLManagedTensorVersioned*> dlpack;
    try {
      check_not_null(out, "out");
      *out = nullptr;
      cfg = config_from(config);
      if (num_groups > 0) check_not_null(groups, "groups");
      for (std::size_t g = 0; g < num_groups; ++g) {
        specs.push_back(group_from(&groups[g], fmt::format("groups[{}]", g), dlpack));
      }
    } catch (...) {
      fail_collectively(*c.comm, "ZeroOptimizer", std::current_exception());
    }
    auto handle = std::make_unique<shardopt_optimizer_s>();
    handle->magic = kOptimizerMagic;
    handle->comm = c.comm;
    handle->owned.reserve(dlpack.size());
    handle->opt = std::make_unique<shardopt::ZeroOptimizer>(c.comm, cfg, std::move(specs));
    register_handle(handle.get(), kOptimizerMagic);
    adopt(*handle, dlpack);
    *out = handle.release();
  });
}

shardopt_status shardopt_optimizer_destroy(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_destroy", [&] {
    if (opt == nullptr) return;
    checked_optimizer(opt, "opt");
    unregister_handle(opt);
    opt->magic = 0;
    // The optimizer first (it may still point into the tensors), then the producers' deleters,
    // in registration order.
    opt->opt.reset();
    for (shardopt::DlpackOwner& t : opt->owned) t.reset();
    delete opt;
  });
}

shardopt_status shardopt_optimizer_add_param_group(shardopt_optimizer_t opt, const shardopt_param_group_desc* group,
                                                   int32_t* out_group) {
  return guard("shardopt_optimizer_add_param_group", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    ParamGroupSpec spec;
    std::vector<DLManagedTensorVersioned*> dlpack;
    try {
      spec = group_from(group, "group", dlpack);
    } catch (...) {
      fail_collectively(*o.comm, "add_param_group", std::current_exception());
    }
    o.owned.reserve(o.owned.size() + dlpack.size());
    const int index = o.opt->add_param_group(std::move(spec));
    adopt(o, dlpack);
    if (out_group != nullptr) *out_group = index;
  });
}

shardopt_status shardopt_optimizer_num_groups(shardopt_optimizer_t opt, int32_t* out) {
  return guard("shardopt_optimizer_num_groups", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->num_groups();
  });
}

shardopt_status shardopt_optimizer_num_params(shardopt_optimizer_t opt, int32_t* out) {
  return guard("shardopt_optimizer_num_params", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->num_params();
  });
}

shardopt_status shardopt_optimizer_find_param(shardopt_optimizer_t opt, const char* name, int32_t* out_id) {
  return guard("shardopt_optimizer_find_param", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(name, "name");
    check_not_null(out_id, "out_id");
    *out_id = o.opt->find_param(name);
  });
}

shardopt_status shardopt_optimizer_get_hyperparams(shardopt_optimizer_t opt, int32_t group, shardopt_hyperparams* out) {
  return guard("shardopt_optimizer_get_hyperparams", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_hyperparams");
    hyper_to(o.opt->hyperparams(group), *out);
  });
}

shardopt_status shardopt_optimizer_get_defaults(shardopt_optimizer_t opt, shardopt_hyperparams* out) {
  return guard("shardopt_optimizer_get_defaults", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_hyperparams");
    hyper_to(o.opt->defaults(), *out);
  });
}

shardopt_status shardopt_default_hyperparams(shardopt_algorithm algorithm, shardopt_hyperparams* out) {
  return guard("shardopt_default_hyperparams", [&] {
    const int value = raw_enum_value(algorithm);
    if (value < 0 || value > 2) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "algorithm is {}, not a shardopt_algorithm (0..2)", value);
    }
    check_struct(out, "out", "shardopt_hyperparams");
    hyper_to(shardopt::default_hyperparams(static_cast<shardopt::Algorithm>(value)), *out);
  });
}

shardopt_status shardopt_optimizer_set_hyperparams(shardopt_optimizer_t opt, int32_t group,
                                                   const shardopt_hyperparams* hyper) {
  return guard("shardopt_optimizer_set_hyperparams", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(hyper, "hyper", "shardopt_hyperparams");
    shardopt::Hyperparams& target = o.opt->hyperparams(group);
    const shardopt::Hyperparams next = hyper_from(*hyper);
    // Checked before it is stored, so a refused value leaves the group as it was.
    shardopt::optim::validate_hyperparams(next, o.opt->config().algorithm, group);
    target = next;
  });
}

shardopt_status shardopt_optimizer_set_trainable(shardopt_optimizer_t opt, int32_t id, int trainable) {
  return guard("shardopt_optimizer_set_trainable", [&] {
    checked_optimizer(opt, "opt").opt->set_trainable(id, trainable != 0);
  });
}

shardopt_status shardopt_optimizer_get_trainable(shardopt_optimizer_t opt, int32_t id, int* out) {
  return guard("shardopt_optimizer_get_trainable", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->trainable(id) ? 1 : 0;
  });
}

shardopt_status shardopt_optimizer_param_step(shardopt_optimizer_t opt, int32_t id, int64_t* out) {
  return guard("shardopt_optimizer_param_step", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->param_step(id);
  });
}

shardopt_status shardopt_optimizer_param_view(shardopt_optimizer_t opt, int32_t id, shardopt_tensor* out) {
  return guard("shardopt_optimizer_param_view", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    tensor_to(o.opt->param_view(id), *out);
  });
}

shardopt_status shardopt_optimizer_grad_view(shardopt_optimizer_t opt, int32_t id, shardopt_tensor* out) {
  return guard("shardopt_optimizer_grad_view", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    tensor_to(o.opt->grad_view(id), *out);
  });
}

shardopt_status shardopt_optimizer_param_owner(shardopt_optimizer_t opt, int32_t id, int32_t* out) {
  return guard("shardopt_optimizer_param_owner", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->param_owner(id);
  });
}

shardopt_status shardopt_optimizer_layout_version(shardopt_optimizer_t opt, uint64_t* out) {
  return guard("shardopt_optimizer_layout_version", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->layout_version();
  });
}

shardopt_status shardopt_optimizer_zero_grad(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_zero_grad", [&] { checked_optimizer(opt, "opt").opt->zero_grad(); });
}

shardopt_status shardopt_optimizer_reduce_gradients(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_reduce_gradients", [&] { checked_optimizer(opt, "opt").opt->reduce_gradients(); });
}

shardopt_status shardopt_optimizer_reduce_gradient(shardopt_optimizer_t opt, int32_t id, const shardopt_tensor* grad) {
  return guard("shardopt_optimizer_reduce_gradient", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(grad, "grad");
    o.opt->reduce_gradient(id, tensor_from_raw(*grad, "grad"));
  });
}

shardopt_status shardopt_optimizer_reduce_gradient_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                          DLManagedTensorVersioned* grad) {
  return guard("shardopt_optimizer_reduce_gradient_dlpack", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(grad, "grad");
    o.opt->reduce_gradient(id, shardopt::tensor_from_dlpack(*grad, "grad"));
    // Copied before reduce_gradient returned: consumed, as a DLPack consumer does. Only on
    // success; a refused tensor stays the caller's.
    shardopt::DlpackOwner(grad).reset();
  });
}

shardopt_status shardopt_optimizer_clip_grad_norm(shardopt_optimizer_t opt, double max_norm, double norm_type,
                                                  double* out_norm) {
  return guard("shardopt_optimizer_clip_grad_norm", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    // out_norm is optional: refusing a NULL on one rank alone would leave the others in the
    // collective.
    const double norm = o.opt->clip_grad_norm(max_norm, norm_type);
    if (out_norm != nullptr) *out_norm = norm;
  });
}

shardopt_status shardopt_optimizer_loss_scale(shardopt_optimizer_t opt, double* out) {
  return guard("shardopt_optimizer_loss_scale", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->loss_scale();
  });
}

shardopt_status shardopt_optimizer_set_loss_scale(shardopt_optimizer_t opt, double scale) {
  return guard("shardopt_optimizer_set_loss_scale",
               [&] { checked_optimizer(opt, "opt").opt->set_loss_scale(scale); });
}

shardopt_status shardopt_optimizer_step(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_step", [&] { checked_optimizer(opt, "opt").opt->step(); });
}

shardopt_status shardopt_optimizer_last_step(shardopt_optimizer_t opt, shardopt_step_report* out) {
  return guard("shardopt_optimizer_last_step", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_step_report");
    const shardopt::StepReport& report = o.opt->last_step();
    out->skipped = report.skipped ? 1 : 0;
    out->loss_scale = report.loss_scale;
    out->grad_norm = report.grad_norm;
    out->clip_coef = report.clip_coef;
    out->skipped_steps = report.skipped_steps;
  });
}

shardopt_status shardopt_optimizer_cuda_stream(shardopt_optimizer_t opt, void** out) {
  return guard("shardopt_optimizer_cuda_stream", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->cuda_stream();
  });
}

shardopt_status shardopt_optimizer_memory_report(shardopt_optimizer_t opt, shardopt_memory_report* out) {
  return guard("shardopt_optimizer_memory_report", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_memory_report");
    const shardopt::MemoryReport report = o.opt->memory_report();
    out->state_bytes = report.state_bytes;
    // The first header's two totals, kept in the struct for its callers: all staging is
    // counted with the gradients, so the two still add up to every byte held but state.
    out->param_buffer_bytes = report.param_bytes;
    out->grad_buffer_bytes = report.grad_bytes + report.buffer_bytes;
    out->shard_numel = report.shard_numel;
    out->trainable_numel = report.trainable_numel;
    // An earlier header's struct ends here: writing on would overrun the caller's memory.
    if (!newer_than<v1::memory_report>(out)) return;
    out->master_bytes = report.master_bytes;
    out->param_bytes = report.param_bytes;
    out->grad_bytes = report.grad_bytes;
    out->buffer_bytes = report.buffer_bytes;
  });
}

shardopt_status shardopt_optimizer_save(shardopt_optimizer_t opt, const char* dir) {
  return guard("shardopt_optimizer_save", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(dir, "dir");
    o.opt->save(dir);
  });
}

shardopt_status shardopt_optimizer_load(shardopt_optimizer_t opt, const char* dir) {
  return guard("shardopt_optimizer_load", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(dir, "dir");
    o.opt->load(dir);
  });
}

shardopt_status shardopt_optimizer_consolidate_state_dict(shardopt_optimizer_t opt, int to) {
  return guard("shardopt_optimizer_consolidate_state_dict", [&] {
    checked_optimizer(opt, "opt").opt->consolidate_state_dict(to);
  });
}

}  // extern "C"
