// src/capi/capi_convert.hpp — the C ABI's structs into the C++ API's types and back (config, hyperparameters, tensors, param groups), and the collective failure of a create or add_param_group.
#pragma once

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "capi/boundary.hpp"

namespace shardopt {
namespace capi {

// A C enum field may hold any int the caller stored; loading it as the enum type would be
// undefined behaviour for values outside the enumerators, so its bytes are read as an int.
template <typename Enum>
int raw_enum_value(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized here");
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

// shardopt_hyperparams <-> Hyperparams, field for field (the C struct's ints are bools here).
Hyperparams hyper_from(const shardopt_hyperparams& h);
void hyper_to(const Hyperparams& h, shardopt_hyperparams& out);

// The optimizer config, checked field by field (NULL: every default). config->defaults, when
// given, is checked here too, so that a bad value fails the create on every rank.
OptimizerConfig config_from(const shardopt_optimizer_config* config);

void tensor_to(const TensorRef& ref, shardopt_tensor& out);
TensorRef tensor_from_raw(const shardopt_tensor& t, const std::string& what);

// reduce_gradient(id, grad) of an optimizer or a post-local-SGD optimizer, from a raw tensor or
// a DLPack one. The gradient is copied before reduce_gradient returns, so a DLPack tensor is
// consumed then, as a DLPack consumer does; only on success: a refused one stays the caller's.
template <typename Target>
void hand_gradient(Target& target, int32_t id, const shardopt_tensor* grad) {
  check_not_null(grad, "grad");
  target.reduce_gradient(id, tensor_from_raw(*grad, "grad"));
}
template <typename Target>
void hand_gradient(Target& target, int32_t id, DLManagedTensorVersioned* grad) {
  check_not_null(grad, "grad");
  target.reduce_gradient(id, tensor_from_dlpack(*grad, "grad"));
  DlpackOwner(grad).reset();
}

// One param group (`where` names it in messages). The DLPack tensors it describes are appended
// to `dlpack`: the caller owns them (see adopt) only once the call that uses them succeeds.
ParamGroupSpec group_from(const shardopt_param_group_desc* group, const std::string& where,
                          std::vector<DLManagedTensorVersioned*>& dlpack);

// This rank failed before the collective registration check `what` that the other ranks are
// entering: take part in it with the failure, so that they fail too (naming this rank) instead
// of waiting, then rethrow the failure here.
[[noreturn]] void fail_collectively(Communicator& comm, const char* what, std::exception_ptr local);

// Takes ownership of the DLPack tensors a successful call consumed: cannot throw (the space was
// reserved before the call), so the caller never loses a tensor it still thinks is its own.
void adopt(shardopt_optimizer_s& handle, const std::vector<DLManagedTensorVersioned*>& dlpack) noexcept;

}  // namespace capi
}  // namespace shardopt
