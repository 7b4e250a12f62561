// kernels/cuda/mixed_kernels.cu — SGD/Adam for f32 and bf16/f16 (fp32 master) parameters, and the dtype conversions: one grid-stride launch each.
//
// Every op runs the plan of launch_plan.hpp with per-stream element sizes (16-byte accesses to
// float streams, 8-byte accesses to 16-bit ones) through plan_kernel.cuh's one kernel. Built
// with --fmad=false: nvcc would otherwise contract the rules' a*b + c into FMAs, which round
// once instead of twice and would make the GPU disagree with the CPU loops (built with
// -ffp-contract=off) in the last bit. sqrtf and '/' are IEEE-rounded by default
// (-prec-sqrt/-prec-div), and denormals are kept (no -ftz), as on the CPU. The conversions are
// integer code from numerics/half_float.hpp and precision.hpp, identical on both sides.
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/cuda_launchers.hpp"
#include "cuda/plan_kernel.cuh"

namespace shardopt {
namespace kernels {
namespace {

// f(format, stochastic) with the element format and rounding mode as types; f32 has no
// rounding to choose.
template <typename F>
int with_mixed_format(DType dtype, bool stochastic, const F& f) {
  switch (dtype) {
    case DType::f32:
      return f(F32Format{}, std::false_type{});
    case DType::bf16:
      return stochastic ? f(Bf16Format{}, std::true_type{}) : f(Bf16Format{}, std::false_type{});
    case DType::f16:
      return stochastic ? f(F16Format{}, std::true_type{}) : f(F16Format{}, std::false_type{});
    case DType::byte: break;  // raw bytes have no element format
  }
  return cudaErrorInvalidValue;
}

template <typename F>
int with_format(DType dtype, const F& f) {
  switch (dtype) {
    case DType::f32: return f(F32Format{});
    case DType::bf16: return f(Bf16Format{});
    case DType::f16: return f(F16Format{});
    case DType::byte: break;  // raw bytes have no element format
  }
  return cudaErrorInvalidValue;
}

// f(op) with the item op the arguments select.
template <typename F>
int with_sgd_op(const MixedSgdArgs& a, const F& f) {
  return with_mixed_format(a.dtype, a.stochastic, [&](auto format, auto stochastic) {
    using Format = decltype(format);
    constexpr bool kStochastic = decltype(stochastic)::value;
    const MixedLanes<Format, kStochastic> lanes{a.common};
    if (a.s.use_momentum) {
      return f(MixedSgdItemOp<Format, kStochastic, true>{lanes, a.momentum_buf, SgdRule{a.s}});
    }
    return f(MixedSgdItemOp<Format, kStochastic, false>{lanes, a.momentum_buf, SgdRule{a.s}});
  });
}

template <typename F>
int with_adam_op(const MixedAdamArgs& a, const F& f) {
  return with_mixed_format(a.dtype, a.stochastic, [&](auto format, auto stochastic) {
    using Format = decltype(format);
    constexpr bool kStochastic = decltype(stochastic)::value;
    const MixedLanes<Format, kStochastic> lanes{a.common};
    if (a.s.amsgrad) {
      return f(MixedAdamItemOp<Format, kStochastic, true>{lanes, a.exp_avg, a.exp_avg_sq,
                                                          a.max_exp_avg_sq, AdamRule{a.s}});
    }
    return f(MixedAdamItemOp<Format, kStochastic, false>{lanes, a.exp_avg, a.exp_avg_sq,
                                                         a.max_exp_avg_sq, AdamRule{a.s}});
  });
}

template <typename Op>
int blocks_of(const Op&, int* blocks) {
  return plan_blocks_per_sm<Op>(blocks);
}

}  // namespace

int mixed_sgd_blocks_per_sm(const MixedSgdArgs& args, int* blocks) {
  return with_sgd_op(args, [&](const auto& op) { return blocks_of(op, blocks); });
}

int mixed_adam_blocks_per_sm(const MixedAdamArgs& args, int* blocks) {
  return with_adam_op(args, [&](const auto& op) { return blocks_of(op, blocks); });
}

int launch_mixed_sgd(const MixedSgdArgs& args, const VectorPlan& plan, const GridShape& grid,
                     void* stream) {
  return with_sgd_op(args, [&](const auto& op) { return launch_plan(plan, op, grid, stream); });
}

int launch_mixed_adam(const MixedAdamArgs& args, const VectorPlan& plan, const GridShape& grid,
                      void* stream) {
  return with_adam_op(args, [&](const auto& op) { return launch_plan(plan, op, grid, stream); });
}

int convert_blocks_per_sm(ConvertKind kind, DType dtype, int* blocks) {
  return with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    switch (kind) {
      case ConvertKind::widen: return blocks_of(WidenItemOp<Format>{}, blocks);
      case ConvertKind::narrow: return blocks_of(NarrowItemOp<Format>{}, blocks);
      case ConvertKind::divide: return blocks_of(DivideItemOp<Format>{}, blocks);
    }
    return static_cast<int>(cudaErrorInvalidValue);
  });
}

int launch_widen(const void* src, DType dtype, float* dst, const VectorPlan& plan,
                 const GridShape& grid, void* stream) {
  return with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    const WidenItemOp<Format> op{static_cast<const typename Format::Storage*>(src), dst};
    return launch_plan(plan, op, grid, stream);
  });
}

int launch_narrow(const float* src, void* dst, DType dtype, const VectorPlan& plan,
                  const GridShape& grid, void* stream) {
  return with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    const NarrowItemOp<Format> op{src, static_cast<typename Format::Storage*>(dst)};
    return launch_plan(plan, op, grid, stream);
  });
}

int launch_divide(void* x, DType dtype, float divisor, const VectorPlan& plan,
                  const GridShape& grid, void* stream) {
  return with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    const DivideItemOp<Format> op{static_cast<typename Format::Storage*>(x), divisor};
    return launch_plan(plan, op, grid, stream);
  });
}

}  // namespace kernels
}  // namespace shardopt
