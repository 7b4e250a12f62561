// python/src/py_tensors.hpp — tensors between Python and the library: DLPack capsules taken from any __dlpack__ producer, and the optimizer's buffers handed back as arrays.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "core/dlpack_import.hpp"
#include "shardopt/shardopt.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// Imported tensors are held by the library's own DlpackOwner (as the C ABI holds them): its
// deleter runs exactly once, when the owner is destroyed.
using shardopt::DlpackOwner;

// Takes the DLPack tensor out of `obj` (consuming the capsule, per the protocol). torch tensors
// that require grad are detached first: the detached tensor shares the same storage.
DlpackOwner take_dlpack(nb::handle obj, const std::string& what);

// The same checks as the C ABI (contiguous, f32/bf16/f16, CPU/CUDA, writable, DLPack 1.x).
shardopt::TensorRef tensor_ref(const DlpackOwner& t, const std::string& what);

// A view of shardopt's (or the caller's) buffer: a numpy array for CPU f32/f16, otherwise an
// array exposing __dlpack__ (torch.from_dlpack). `keeper` (ZeroOptimizer::param_view_owner)
// keeps shardopt's memory alive as long as the array, through layout changes; without one (the
// caller's external buffers) the array holds the optimizer object `owner`, which holds them.
nb::object view(const shardopt::TensorRef& ref, nb::handle owner, std::shared_ptr<const void> keeper);

// A numpy array that owns a copy of `values`.
nb::object numpy_copy(const std::vector<float>& values);

}  // namespace shardopt_python
