// src/capi/capi_state_dict.cpp — the C functions over a consolidated state dict: take it from the optimizer, enumerate parameters, state kinds and groups, copy state tensors out (size-checked).
#include <cstring>

#include "capi/capi_convert.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace capi {
namespace {

void check_param_id(const shardopt_state_dict_s& d, int32_t id) {
  const std::size_t n = d.params.size();
  if (id < 0 || static_cast<std::size_t>(id) >= n) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "id {} is not a parameter of this state dict (0..{})", id,
         static_cast<int64_t>(n) - 1);
  }
}

void check_group(const shardopt_state_dict_s& d, int32_t group) {
  const std::size_t n = d.dict.param_groups.size();
  if (group < 0 || static_cast<std::size_t>(group) >= n) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT, "group {} is not a param group of this state dict (0..{})", group,
         static_cast<int64_t>(n) - 1);
  }
}

// The dict the optimizer holds on this rank, with each parameter's numel and dtype as
// registered, its group as the dict's groups list it, and its state kinds in map order.
std::unique_ptr<shardopt_state_dict_s> snapshot(const ZeroOptimizer& opt) {
  auto handle = std::make_unique<shardopt_state_dict_s>();
  handle->dict = opt.state_dict();
  const StateDict& dict = handle->dict;
  const std::size_t n = dict.param_names.size();
  handle->params.resize(n);
  handle->kinds.resize(n);
  for (std::size_t id = 0; id < n; ++id) {
    const TensorRef view = opt.param_view(static_cast<ParamId>(id));
    handle->params[id].numel = view.numel;
    handle->params[id].dtype = view.dtype;
  }
  for (std::size_t g = 0; g < dict.param_groups.size(); ++g) {
    for (ParamId id : dict.param_groups[g].params) {
      if (id >= 0 && static_cast<std::size_t>(id) < n) handle->params[id].group = static_cast<int32_t>(g);
    }
  }
  for (const auto& [id, state] : dict.state) {
    // The C ABI copies fp32 state tensors only: a dict without the 8-bit moments would load as
    // fresh moments, so it is refused rather than handed out incomplete.
    SHARDOPT_CHECK(state.q8.empty(), unsupported,
                   "shardopt_optimizer_state_dict: parameter '{}' keeps 8-bit moments (state_precision q8), which "
                   "the C ABI's state dict does not carry yet; sharded checkpoints (shardopt_optimizer_save) do",
                   dict.param_names.at(static_cast<std::size_t>(id)));
    for (const auto& kind : state.tensors) handle->kinds.at(id).push_back(kind.first);
  }
  return handle;
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;

extern "C" {

shardopt_status shardopt_optimizer_state_dict(shardopt_optimizer_t opt, shardopt_state_dict_t* out) {
  return guard("shardopt_optimizer_state_dict", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = nullptr;
    std::unique_ptr<shardopt_state_dict_s> handle = snapshot(*o.opt);
    handle->magic = kStateDictMagic;
    register_handle(handle.get(), kStateDictMagic);
    *out = handle.release();
  });
}

shardopt_status shardopt_state_dict_destroy(shardopt_state_dict_t dict) {
  return guard("shardopt_state_dict_destroy", [&] {
    if (dict == nullptr) return;
    checked_state_dict(dict, "dict");
    unregister_handle(dict);
    dict->magic = 0;
    delete dict;
  });
}

shardopt_status shardopt_state_dict_get_info(shardopt_state_dict_t dict, shardopt_state_dict_info* out) {
  return guard("shardopt_state_dict_get_info", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_struct(out, "out", "shardopt_state_dict_info");
    out->algorithm = static_cast<shardopt_algorithm>(d.dict.algorithm);
    out->num_params = static_cast<int32_t>(d.params.size());
    out->num_groups = static_cast<int32_t>(d.dict.param_groups.size());
    out->num_stateful = static_cast<int32_t>(d.dict.state.size());
  });
}

shardopt_status shardopt_state_dict_get_param(shardopt_state_dict_t dict, int32_t id, shardopt_state_dict_param* out) {
  return guard("shardopt_state_dict_get_param", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_struct(out, "out", "shardopt_state_dict_param");
    check_param_id(d, id);
    const auto state = d.dict.state.find(id);
    out->name = d.dict.param_names[id].c_str();
    out->numel = d.params[id].numel;
    out->dtype = static_cast<shardopt_dtype>(d.params[id].dtype);
    out->group = d.params[id].group;
    out->step = state == d.dict.state.end() ? 0 : state->second.step;
    out->num_states = static_cast<int32_t>(d.kinds[id].size());
  });
}

shardopt_status shardopt_state_dict_state_kind(shardopt_state_dict_t dict, int32_t id, int32_t index,
                                               const char** out_kind) {
  return guard("shardopt_state_dict_state_kind", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_not_null(out_kind, "out_kind");
    check_param_id(d, id);
    const std::vector<std::string>& kinds = d.kinds[id];
    if (index < 0 || static_cast<std::size_t>(index) >= kinds.size()) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "index {} is not a state kind of parameter '{}', which has {}", index,
           d.dict.param_names[id], kinds.size());
    }
    *out_kind = kinds[index].c_str();
  });
}

shardopt_status shardopt_state_dict_copy_state(shardopt_state_dict_t dict, int32_t id, const char* kind, float* dst,
                                               size_t dst_bytes) {
  return guard("shardopt_state_dict_copy_state", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_not_null(kind, "kind");
    check_param_id(d, id);
    const std::string& name = d.dict.param_names[id];
    const std::vector<float>* found = nullptr;
    const auto state = d.dict.state.find(id);
    if (state != d.dict.state.end()) {
      const auto tensor = state->second.tensors.find(kind);
      if (tensor != state->second.tensors.end()) found = &tensor->second;
    }
    if (found == nullptr) {
      std::string present;
      for (const std::string& k : d.kinds[id]) present += (present.empty() ? "'" : ", '") + k + "'";
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "parameter '{}' has no state '{}'; it has {}", name, kind,
           present.empty() ? std::string("no state (frozen, or never stepped)") : present);
    }
    const std::vector<float>& values = *found;
    const std::size_t needed = values.size() * sizeof(float);
    if (dst_bytes != needed) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT,
           "dst_bytes is {}, but state '{}' of parameter '{}' is {} fp32 values, {} bytes", dst_bytes, kind, name,
           values.size(), needed);
    }
    if (needed == 0) return;
    check_not_null(dst, "dst");
    std::memcpy(dst, values.data(), needed);
  });
}

shardopt_status shardopt_state_dict_get_group(shardopt_state_dict_t dict, int32_t group, shardopt_hyperparams* out_hyper,
                                              int32_t* out_num_params) {
  return guard("shardopt_state_dict_get_group", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_group(d, group);
    const shardopt::ParamGroupState& g = d.dict.param_groups[group];
    if (out_hyper != nullptr) {
      check_struct(out_hyper, "out_hyper", "shardopt_hyperparams");
      hyper_to(g.hyper, *out_hyper);
    }
    if (out_num_params != nullptr) *out_num_params = static_cast<int32_t>(g.params.size());
  });
}

shardopt_status shardopt_state_dict_group_params(shardopt_state_dict_t dict, int32_t group, int32_t* ids,
                                                 size_t capacity) {
  return guard("shardopt_state_dict_group_params", [&] {
    const shardopt_state_dict_s& d = checked_state_dict(dict, "dict");
    check_group(d, group);
    const std::vector<shardopt::ParamId>& params = d.dict.param_groups[group].params;
    if (capacity != params.size()) {
      fail(SHARDOPT_ERR_INVALID_ARGUMENT, "capacity is {}, but group {} has {} parameters", capacity, group,
           params.size());
    }
    if (params.empty()) return;
    check_not_null(ids, "ids");
    for (std::size_t i = 0; i < params.size(); ++i) ids[i] = params[i];
  });
}

}  // extern "C"
