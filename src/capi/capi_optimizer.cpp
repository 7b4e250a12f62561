// src/capi/capi_optimizer.cpp — the C functions that make and shape a ZeroOptimizer: collective create from param-group arrays, destroy, add_param_group, lookups, hyperparameters and defaults, trainable flags.
#include "capi/capi_convert.hpp"
#include "optim/hyperparams.hpp"

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
    handle->opt = std::make_unique<shardopt::ZeroOptimizer>(c.comm, std::move(specs), cfg);
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
    // Freed now, or by the last averager still built over it.
    retire_optimizer(opt);
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
    if (value < 0 || value > 3) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "algorithm is {}, not a shardopt_algorithm (0..3)", value);
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

}  // extern "C"
