// src/core/dlpack_import.cpp — the checks that turn a DLPack tensor into a TensorRef, each refusal saying what is wrong.
#include "core/dlpack_import.hpp"

#include <cstdint>
#include <limits>

#include "core/check.hpp"

namespace shardopt {
namespace {

std::string dlpack_dtype_name(DLDataType dtype) {
  const char* base = nullptr;
  switch (dtype.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case kDLBool: base = "bool"; break;
    default: break;
  }
  std::string name = base != nullptr ? fmt::format("{}{}", base, dtype.bits)
                                     : fmt::format("type code {} with {} bits", dtype.code, dtype.bits);
  if (dtype.lanes != 1) name += fmt::format(" x{} lanes", dtype.lanes);
  return name;
}

const char* dlpack_device_name(int32_t type) {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    case kDLOneAPI: return "kDLOneAPI";
    default: return "device type";  // one this header does not name
  }
}

}  // namespace

TensorRef tensor_from_dlpack(const DLManagedTensorVersioned& tensor, const std::string& what) {
  // A different major version may lay the struct out differently: read nothing else first.
  SHARDOPT_CHECK(tensor.version.major == DLPACK_MAJOR_VERSION, unsupported,
                 "{}: DLPack major version {} is not supported (shardopt reads version {}.x)", what,
                 tensor.version.major, DLPACK_MAJOR_VERSION);
  const DLTensor& t = tensor.dl_tensor;

  SHARDOPT_CHECK(t.ndim >= 0, invalid_argument, "{}: ndim is negative ({})", what, t.ndim);
  SHARDOPT_CHECK(t.ndim == 0 || t.shape != nullptr, invalid_argument, "{}: shape is NULL but ndim is {}",
                 what, t.ndim);
  int64_t numel = 1;
  for (int32_t d = 0; d < t.ndim; ++d) {
    SHARDOPT_CHECK(t.shape[d] >= 0, invalid_argument, "{}: shape[{}] is negative ({})", what, d, t.shape[d]);
    // Overflow-safe product: a size that cannot be addressed is malformed, not huge.
    SHARDOPT_CHECK(t.shape[d] == 0 || numel <= std::numeric_limits<int64_t>::max() / 8 / t.shape[d],
                   invalid_argument, "{}: the shape's element count overflows", what);
    numel *= t.shape[d];
  }

  DType dtype = DType::f32;
  const bool one_lane = t.dtype.lanes == 1;
  if (one_lane && t.dtype.code == kDLFloat && t.dtype.bits == 32) {
    dtype = DType::f32;
  } else if (one_lane && t.dtype.code == kDLBfloat && t.dtype.bits == 16) {
    dtype = DType::bf16;
  } else if (one_lane && t.dtype.code == kDLFloat && t.dtype.bits == 16) {
    dtype = DType::f16;
  } else {
    raise(ErrorCode::unsupported, "{}: dtype {} is not supported (float32, bfloat16 or float16)", what,
          dlpack_dtype_name(t.dtype));
  }

  Device device = Device::cpu();
  if (t.device.device_type == kDLCPU) {
    device = Device::cpu();
  } else if (t.device.device_type == kDLCUDA) {
    SHARDOPT_CHECK(t.device.device_id >= 0, invalid_argument, "{}: CUDA device id is negative ({})", what,
                   t.device.device_id);
    device = Device::cuda(t.device.device_id);
  } else {
    raise(ErrorCode::unsupported, "{}: {} ({}) is not supported (kDLCPU or kDLCUDA)", what,
          dlpack_device_name(static_cast<int32_t>(t.device.device_type)),
          static_cast<int32_t>(t.device.device_type));
  }

  // The optimizer writes parameters and gradients in place.
  SHARDOPT_CHECK((tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0, invalid_argument,
                 "{}: the tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY), but shardopt writes into it",
                 what);

  if (t.strides != nullptr && numel > 0) {
    // Extents of 1 may carry any stride (torch reports them freely); every other must be compact.
    int64_t expected = 1;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      SHARDOPT_CHECK(t.shape[d] == 1 || t.strides[d] == expected, invalid_argument,
                     "{}: not contiguous: stride {} of dimension {} (extent {}) should be {}; pass a "
                     "contiguous tensor",
                     what, t.strides[d], d, t.shape[d], expected);
      expected *= t.shape[d];
    }
  }

  char* data = static_cast<char*>(t.data);
  if (data != nullptr) data += t.byte_offset;
  SHARDOPT_CHECK(data != nullptr || numel == 0, invalid_argument, "{}: data is NULL but it has {} elements",
                 what, numel);
  SHARDOPT_CHECK(reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) == 0, invalid_argument,
                 "{}: data (with byte_offset {}) is not aligned to its {}-byte elements", what, t.byte_offset,
                 dtype_size(dtype));

  TensorRef ref;
  ref.data = data;
  ref.numel = numel;
  ref.dtype = dtype;
  ref.device = device;
  return ref;
}

}  // namespace shardopt
