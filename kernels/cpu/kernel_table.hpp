// kernels/cpu/kernel_table.hpp — one ISA variant's CPU kernels as a table of function pointers, the table of a given variant, and the one this process uses.
//
// The public functions (update_cpu.hpp, stream_cpu.hpp) check their arguments and call the
// active table; tests call a given variant's table to compare variants bit for bit. The
// table's functions trust their arguments (n >= 0, the buffers a call uses non-null, a dtype
// with arithmetic, a master exactly for 16-bit parameters): check them as the public
// functions do before calling one directly.
#pragma once

#include <cstdint>

#include "cpu/cpu_isa.hpp"
#include "cpu/stream_cpu.hpp"
#include "cpu/update_cpu.hpp"

namespace shardopt {
namespace kernels {

struct CpuKernelTable {
  CpuIsa isa;
  // update_cpu.hpp
  void (*sgd_update)(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                     const GradTransform& gt, const Rounding& r, int threads);
  void (*adam_update)(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                      int64_t n, const AdamScalars& s, const GradTransform& gt, const Rounding& r,
                      int threads);
  void (*adam_update_q8)(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                         const GradTransform& gt, const Rounding& r, int threads);
  GradStats (*grad_stats)(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm, int threads);
  void (*widen)(const void* src, DType dtype, float* dst, int64_t n, int threads);
  void (*narrow)(const float* src, void* dst, DType dtype, int64_t n, int threads);
  void (*divide)(void* x, DType dtype, int64_t n, float divisor, int threads);
  void (*average_slots)(const void* const* inputs, int input_count, void* const* outputs, int output_count,
                        DType dtype, int64_t n, float divisor, int threads);
  // stream_cpu.hpp
  void (*stream_copy)(const float* a, float* c, int64_t n, int threads);
  void (*stream_triad)(float* a, const float* b, const float* c, float s, int64_t n, int threads);
  void (*fill_f32)(float* x, float value, int64_t n, int threads);
  void (*fill_u16)(uint16_t* x, uint16_t value, int64_t n, int threads);
  void (*update_pattern)(UpdatePattern pattern, float* p, const float* g, float* m, float* v, int64_t n,
                         int threads);
  void (*update_pattern_half)(UpdatePattern pattern, float* master, const uint16_t* g16, uint16_t* p16,
                              float* m, float* v, int64_t n, int threads);
};

// The variant compiled for `isa`. Error(unsupported) when this build has none, or when this
// CPU cannot run it (so a test never executes an instruction the CPU lacks).
const CpuKernelTable& cpu_kernel_table(CpuIsa isa);

// The table of active_cpu_isa(), looked up on the first call and cached; throws what
// active_cpu_isa() throws.
const CpuKernelTable& active_cpu_kernels();

}  // namespace kernels
}  // namespace shardopt
