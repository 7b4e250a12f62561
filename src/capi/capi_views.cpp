// src/capi/capi_views.cpp — bucket views exported as DLPack tensors that own a share of the memory they point into.
#include <memory>
#include <utility>

#include "capi/capi_convert.hpp"

using namespace shardopt::capi;

namespace {

// What an exported tensor owns: its shape, and a share of shardopt's flat buffer that keeps the
// memory allocated (or a node-shared buffer mapped) until the consumer calls the deleter, even
// after a layout change replaced the buffer or the optimizer was destroyed.
struct ExportedView {
  DLManagedTensorVersioned tensor{};
  int64_t shape[1] = {0};
  std::shared_ptr<const void> keeper;
};

void delete_exported(DLManagedTensorVersioned* self) {
  if (self != nullptr) delete static_cast<ExportedView*>(self->manager_ctx);
}

DLDataType dlpack_dtype(shardopt::DType dtype) {
  switch (dtype) {
    case shardopt::DType::bf16:
      return DLDataType{static_cast<uint8_t>(kDLBfloat), 16, 1};
    case shardopt::DType::f16:
      return DLDataType{static_cast<uint8_t>(kDLFloat), 16, 1};
    default:
      return DLDataType{static_cast<uint8_t>(kDLFloat), 32, 1};
  }
}

DLManagedTensorVersioned* export_view(const shardopt::TensorRef& view, std::shared_ptr<const void> keeper,
                                      const char* call) {
  if (!keeper) {
    fail(SHARDOPT_ERR_INVALID_ARGUMENT,
         "{}: bucket_view storage only (with external storage the buffers are the caller's own: export them "
         "yourself)",
         call);
  }
  auto exported = std::make_unique<ExportedView>();
  exported->shape[0] = view.numel;
  exported->keeper = std::move(keeper);
  DLManagedTensorVersioned& t = exported->tensor;
  t.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  t.manager_ctx = exported.get();
  t.deleter = delete_exported;
  t.flags = 0;
  t.dl_tensor.data = view.data;
  t.dl_tensor.device = DLDevice{view.device.is_cuda() ? kDLCUDA : kDLCPU, view.device.is_cuda() ? view.device.index : 0};
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype = dlpack_dtype(view.dtype);
  t.dl_tensor.shape = exported->shape;
  t.dl_tensor.strides = nullptr;
  t.dl_tensor.byte_offset = 0;
  return &exported.release()->tensor;
}

}  // namespace

extern "C" {

shardopt_status shardopt_optimizer_param_view_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                     DLManagedTensorVersioned** out) {
  return guard("shardopt_optimizer_param_view_dlpack", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = export_view(o.opt->param_view(id), o.opt->param_view_owner(id), "shardopt_optimizer_param_view_dlpack");
  });
}

shardopt_status shardopt_optimizer_grad_view_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                    DLManagedTensorVersioned** out) {
  return guard("shardopt_optimizer_grad_view_dlpack", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = export_view(o.opt->grad_view(id), o.opt->grad_view_owner(id), "shardopt_optimizer_grad_view_dlpack");
  });
}

}  // extern "C"
