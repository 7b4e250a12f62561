// src/core/dlpack_import.hpp — DLPack (DLManagedTensorVersioned) to TensorRef, with the checks the optimizer relies on, and an owner that runs the deleter once.
#pragma once

#include <string>

#include "shardopt/dlpack.h"
#include "shardopt/types.hpp"

namespace shardopt {

// Describes `tensor` as a TensorRef after checking, in this order: DLPack major version 1
// (nothing else may be read otherwise), a sane shape, one-lane f32/bf16/f16, kDLCPU or kDLCUDA,
// not flagged read-only, compact row-major strides (NULL, or equal to the compact ones wherever
// the extent is not 1), a data pointer aligned to the element size. Raises Error(unsupported)
// for a dtype, device or version shardopt cannot take and Error(invalid_argument) for the rest;
// `what` names the tensor in the message ("parameter 'fc.weight'"). Never calls the deleter.
TensorRef tensor_from_dlpack(const DLManagedTensorVersioned& tensor, const std::string& what);

// Holds one DLManagedTensorVersioned and calls its deleter exactly once, when destroyed
// (a null deleter means the producer needs no notification). Move-only.
class DlpackOwner {
 public:
  DlpackOwner() = default;
  explicit DlpackOwner(DLManagedTensorVersioned* tensor) : tensor_(tensor) {}
  DlpackOwner(DlpackOwner&& other) noexcept : tensor_(other.tensor_) { other.tensor_ = nullptr; }
  DlpackOwner& operator=(DlpackOwner&& other) noexcept {
    if (this != &other) {
      reset();
      tensor_ = other.tensor_;
      other.tensor_ = nullptr;
    }
    return *this;
  }
  DlpackOwner(const DlpackOwner&) = delete;
  DlpackOwner& operator=(const DlpackOwner&) = delete;
  ~DlpackOwner() { reset(); }

  DLManagedTensorVersioned* get() const { return tensor_; }
  // Gives the tensor back without calling its deleter (the caller owns it again).
  DLManagedTensorVersioned* release() {
    DLManagedTensorVersioned* t = tensor_;
    tensor_ = nullptr;
    return t;
  }
  void reset() {
    DLManagedTensorVersioned* t = release();
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }

 private:
  DLManagedTensorVersioned* tensor_ = nullptr;
};

}  // namespace shardopt
