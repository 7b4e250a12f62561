// kernels/update_checks.hpp — the update kernels' host-side argument checks, shared by the CPU dispatch and the CUDA launchers so both refuse the same tensors with the same words.
#pragma once

#include "kernel_check.hpp"
#include "mixed_update.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace kernels {

inline void check_dtype(DType dtype, const char* op) {
  SHARDOPT_KERNEL_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
                        invalid_argument, "{}: unknown dtype {}", op, static_cast<int>(dtype));
}

inline void check_buffer(const void* p, const char* op, const char* name) {
  SHARDOPT_KERNEL_CHECK(p != nullptr, invalid_argument, "{}: `{}` is null", op, name);
}

// The parameter and gradient exist, and a master exists exactly when the parameter is 16-bit:
// an fp32 array, or (bf16 only) remainders in its place.
inline void check_update_tensors(const UpdateTensors& t, const char* op) {
  check_dtype(t.dtype, op);
  check_buffer(t.param, op, "param");
  check_buffer(t.grad, op, "grad");
  SHARDOPT_KERNEL_CHECK(t.dtype != DType::f32 || t.master == nullptr, invalid_argument,
                        "{}: an f32 parameter is its own master, but `master` is not null", op);
  if (t.master_remainder != nullptr) {
    SHARDOPT_KERNEL_CHECK(t.dtype == DType::bf16 && t.master == nullptr, invalid_argument,
                          "{}: `master_remainder` holds the master of bf16 parameters in place of `master`, but the "
                          "parameter is {} and `master` is {}",
                          op, dtype_name(t.dtype), t.master == nullptr ? "null" : "set");
    return;
  }
  SHARDOPT_KERNEL_CHECK(t.dtype == DType::f32 || t.master != nullptr, invalid_argument,
                        "{}: a {} parameter needs an fp32 master, but `master` is null", op,
                        dtype_name(t.dtype));
}

// Master remainders rebuild the master only for a parameter rounded to nearest from it.
inline void check_remainder_rounding(const UpdateTensors& t, const Rounding& r, const char* op) {
  SHARDOPT_KERNEL_CHECK(t.master_remainder == nullptr || !r.stochastic, invalid_argument,
                        "{}: stochastic rounding cannot combine with `master_remainder`", op);
}

}  // namespace kernels
}  // namespace shardopt
