// kernels/cpu/cpu_variant.hpp — the ISA variant a loop file is being compiled as: its namespace, its target region, and the entry points every variant defines.
//
// update_cpu.cpp, update_q8_cpu.cpp, convert_cpu.cpp, stream_cpu.cpp and variant_table.cpp are compiled once per
// variant, through one-line wrappers that CMake generates: each defines
// SHARDOPT_CPU_VARIANT_<ISA> and includes the file. Everything between
// SHARDOPT_CPU_VARIANT_BEGIN and SHARDOPT_CPU_VARIANT_END lives in the namespace
// kernels::cpu_<isa> and is compiled for that ISA by a target pragma, not by -m flags: the
// headers included before BEGIN (the rules, the conversions, std:: and fmt templates) keep the
// baseline ISA in every object. Otherwise the linker, which keeps one copy of each inline
// function, could hand baseline code an AVX2 copy and crash a CPU without AVX2. The header
// helpers are inlined into the variant's loops (a baseline callee may inline into a wider
// caller), so the loops are vectorised for the variant.
//
// Same bits in every variant: no variant enables FMA contraction (-ffp-contract=off holds for
// the whole target), -ffast-math or approximate reciprocals; the reductions' order does not
// depend on the vector width (grad_stats.hpp). AVX-512's BF16 conversion instructions are not
// used: VCVTNEPS2BF16 flushes subnormals, so it cannot give numerics/'s bits.
#pragma once

#include "cpu/kernel_table.hpp"

#if defined(SHARDOPT_CPU_VARIANT_BASELINE)
#define SHARDOPT_CPU_NS cpu_baseline
#define SHARDOPT_CPU_VARIANT_ISA ::shardopt::kernels::CpuIsa::baseline
#elif defined(SHARDOPT_CPU_VARIANT_AVX2)
#define SHARDOPT_CPU_NS cpu_avx2
#define SHARDOPT_CPU_VARIANT_ISA ::shardopt::kernels::CpuIsa::avx2
#define SHARDOPT_CPU_TARGET "avx2,fma,f16c"
#elif defined(SHARDOPT_CPU_VARIANT_AVX512)
#define SHARDOPT_CPU_NS cpu_avx512
#define SHARDOPT_CPU_VARIANT_ISA ::shardopt::kernels::CpuIsa::avx512
#define SHARDOPT_CPU_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#else
#error "compile this file through a generated variant wrapper (SHARDOPT_CPU_VARIANT_<ISA>)"
#endif

// F16C conversions: in the AVX2 and AVX-512 variants, and in a baseline built with
// -march=native on a CPU that has them. (A target pragma does not define __F16C__ in C++.)
#if defined(SHARDOPT_CPU_TARGET) || defined(__F16C__)
#define SHARDOPT_CPU_HAS_F16C 1
#else
#define SHARDOPT_CPU_HAS_F16C 0
#endif

// _Pragma takes a string; the extra level expands SHARDOPT_CPU_TARGET before it is quoted.
#define SHARDOPT_CPU_PRAGMA(x) _Pragma(#x)
#if !defined(SHARDOPT_CPU_TARGET)
#define SHARDOPT_CPU_TARGET_PUSH
#define SHARDOPT_CPU_TARGET_POP
#elif defined(__clang__)
#define SHARDOPT_CPU_CLANG_TARGET(t) \
  SHARDOPT_CPU_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define SHARDOPT_CPU_TARGET_PUSH SHARDOPT_CPU_CLANG_TARGET(SHARDOPT_CPU_TARGET)
#define SHARDOPT_CPU_TARGET_POP _Pragma("clang attribute pop")
#elif defined(__GNUC__)
#define SHARDOPT_CPU_GCC_TARGET(t) SHARDOPT_CPU_PRAGMA(GCC target(t))
#define SHARDOPT_CPU_TARGET_PUSH _Pragma("GCC push_options") SHARDOPT_CPU_GCC_TARGET(SHARDOPT_CPU_TARGET)
#define SHARDOPT_CPU_TARGET_POP _Pragma("GCC pop_options")
#else
#error "ISA variants need GCC or Clang (CMake compiles only the baseline with other compilers)"
#endif

// Put after the last #include: nothing may be included inside.
#define SHARDOPT_CPU_VARIANT_BEGIN \
  SHARDOPT_CPU_TARGET_PUSH namespace shardopt { namespace kernels { namespace SHARDOPT_CPU_NS {
#define SHARDOPT_CPU_VARIANT_END \
  }                              \
  }                              \
  }                              \
  SHARDOPT_CPU_TARGET_POP

// The variant's entry points, one per CpuKernelTable slot, with the same meaning as the public
// functions of update_cpu.hpp and stream_cpu.hpp but no argument checks.
SHARDOPT_CPU_VARIANT_BEGIN
void sgd_update(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                const GradTransform& gt, const Rounding& r, int threads);
void adam_update(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq, int64_t n,
                 const AdamScalars& s, const GradTransform& gt, const Rounding& r, int threads);
void adam_update_q8(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                    const GradTransform& gt, const Rounding& r, int threads);
GradStats grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm, int threads);
void widen(const void* src, DType dtype, float* dst, int64_t n, int threads);
void narrow(const float* src, void* dst, DType dtype, int64_t n, int threads);
void divide(void* x, DType dtype, int64_t n, float divisor, int threads);
void average_slots(const void* const* inputs, int input_count, void* const* outputs, int output_count, DType dtype,
                   int64_t n, float divisor, int threads);
void stream_copy(const float* a, float* c, int64_t n, int threads);
void stream_triad(float* a, const float* b, const float* c, float s, int64_t n, int threads);
void fill_f32(float* x, float value, int64_t n, int threads);
void fill_u16(uint16_t* x, uint16_t value, int64_t n, int threads);
void update_pattern(UpdatePattern pattern, float* p, const float* g, float* m, float* v, int64_t n, int threads);
void update_pattern_half(UpdatePattern pattern, float* master, const uint16_t* g16, uint16_t* p16, float* m,
                         float* v, int64_t n, int threads);
extern const CpuKernelTable kernel_table;
SHARDOPT_CPU_VARIANT_END
