// python/src/py_tensors.cpp — tensors between Python and the library: __dlpack__ capsules (DLPack 1.x and pre-1.0) into owned, checked TensorRefs; buffers back out as numpy or DLPack arrays.
#include "py_tensors.hpp"

#include <nanobind/ndarray.h>

#include <cstdint>

#include "shardopt/shardopt.h"

using namespace nb::literals;

namespace shardopt_python {

using shardopt::Error;
using shardopt::ErrorCode;

namespace {

// A pre-1.0 ("dltensor") capsule seen as a versioned tensor; deleting it deletes the original.
struct LegacyTensor {
  DLManagedTensorVersioned versioned;
  DLManagedTensor* legacy;
};

void delete_legacy(DLManagedTensorVersioned* self) {
  auto* wrapper = static_cast<LegacyTensor*>(self->manager_ctx);
  if (wrapper->legacy->deleter != nullptr) wrapper->legacy->deleter(wrapper->legacy);
  delete wrapper;
}

}  // namespace

DlpackOwner take_dlpack(nb::handle obj, const std::string& what) {
  nb::object source = nb::borrow(obj);
  if (nb::hasattr(source, "detach") && nb::hasattr(source, "requires_grad")) source = source.attr("detach")();
  if (!nb::hasattr(source, "__dlpack__")) {
    throw Error(ErrorCode::invalid_argument,
                what + ": a " + std::string(nb::type_name(source.type()).c_str()) +
                    " does not expose __dlpack__ (pass a torch tensor, a numpy array or another DLPack producer)");
  }
  nb::object capsule;
  try {
    capsule = source.attr("__dlpack__")("max_version"_a = nb::make_tuple(1, 0));
  } catch (nb::python_error& e) {
    // Producers predating DLPack 1.0 (torch < 2.4, numpy < 2.1) know no max_version.
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = source.attr("__dlpack__")();
  }
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    return DlpackOwner(t);
  }
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* legacy = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    auto* wrapper = new LegacyTensor{};
    wrapper->legacy = legacy;
    wrapper->versioned.version = DLPackVersion{1, 0};
    wrapper->versioned.manager_ctx = wrapper;
    wrapper->versioned.deleter = delete_legacy;
    wrapper->versioned.flags = 0;
    wrapper->versioned.dl_tensor = legacy->dl_tensor;
    PyCapsule_SetName(cap, "used_dltensor");
    return DlpackOwner(&wrapper->versioned);
  }
  throw Error(ErrorCode::invalid_argument, what + ": __dlpack__() did not return a DLPack capsule");
}

shardopt::TensorRef tensor_ref(const DlpackOwner& t, const std::string& what) {
  shardopt_tensor out{};
  const shardopt_status status = shardopt_tensor_from_dlpack(t.get(), &out);
  if (status != SHARDOPT_OK) {
    std::string message = shardopt_last_error();
    const std::string prefix = "shardopt_tensor_from_dlpack: tensor: ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    throw Error(static_cast<ErrorCode>(static_cast<int>(status)), what + ": " + message);
  }
  shardopt::TensorRef ref;
  ref.data = out.data;
  ref.numel = out.numel;
  ref.dtype = static_cast<shardopt::DType>(out.dtype);
  ref.device = out.device_kind == SHARDOPT_DEVICE_CUDA ? shardopt::Device::cuda(out.device_index) : shardopt::Device::cpu();
  return ref;
}

nb::object view(const shardopt::TensorRef& ref, nb::handle optimizer, std::shared_ptr<const void> keeper) {
  nb::object owner = nb::borrow(optimizer);
  if (keeper) {
    // The array owns a share of the buffer, not the optimizer: set_trainable, add_param_group or
    // a load may replace the buffer, and the array must not point into freed memory then.
    auto* held = new std::shared_ptr<const void>(std::move(keeper));
    owner = nb::capsule(held, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  }
  const std::size_t shape[1] = {static_cast<std::size_t>(ref.numel)};
  nb::dlpack::dtype dtype = nb::dtype<float>();
  if (ref.dtype == shardopt::DType::f16) dtype = nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  if (ref.dtype == shardopt::DType::bf16) dtype = nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  const int32_t device_type = ref.device.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  const int32_t device_id = ref.device.is_cuda() ? ref.device.index : 0;
  if (ref.device.is_cpu() && ref.dtype != shardopt::DType::bf16) {
    return nb::cast(nb::ndarray<nb::numpy>(ref.data, 1, shape, owner, nullptr, dtype, device_type, device_id));
  }
  return nb::cast(nb::ndarray<>(ref.data, 1, shape, owner, nullptr, dtype, device_type, device_id));
}

nb::object numpy_copy(const std::vector<float>& values) {
  auto* heap = new std::vector<float>(values);
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const std::size_t shape[1] = {heap->size()};
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(heap->data(), 1, shape, owner));
}

}  // namespace shardopt_python
