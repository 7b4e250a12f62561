// kernels/cpu/dispatch_cpu.cpp — the public CPU kernel functions (update_cpu.hpp, stream_cpu.hpp): argument checks, then the active ISA variant's loop.
//
// Compiled once, for the baseline. The variant is looked up on the first call (it may throw
// Error(unsupported) when SHARDOPT_CPU_ISA names one this CPU lacks) and cached; afterwards a
// call costs one indirect jump.
#include "cpu/kernel_table.hpp"
#include "update_checks.hpp"

namespace shardopt {
namespace kernels {

void sgd_update_cpu(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                    const GradTransform& gt, const Rounding& r, int threads) {
  if (n <= 0) return;
  check_update_tensors(t, "sgd_update_cpu");
  check_remainder_rounding(t, r, "sgd_update_cpu");
  if (s.use_momentum) check_buffer(momentum_buf, "sgd_update_cpu", "momentum_buf");
  active_cpu_kernels().sgd_update(t, momentum_buf, n, s, gt, r, threads);
}

void adam_update_cpu(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s,
                     const GradTransform& gt, const Rounding& r, int threads) {
  if (n <= 0) return;
  check_update_tensors(t, "adam_update_cpu");
  check_remainder_rounding(t, r, "adam_update_cpu");
  check_buffer(exp_avg, "adam_update_cpu", "exp_avg");
  check_buffer(exp_avg_sq, "adam_update_cpu", "exp_avg_sq");
  if (s.amsgrad) check_buffer(max_exp_avg_sq, "adam_update_cpu", "max_exp_avg_sq");
  active_cpu_kernels().adam_update(t, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, gt, r, threads);
}

void adam_update_q8_cpu(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                        const GradTransform& gt, const Rounding& r, int threads) {
  if (n <= 0) return;
  check_update_tensors(t, "adam_update_q8_cpu");
  check_remainder_rounding(t, r, "adam_update_q8_cpu");
  check_buffer(q.exp_avg, "adam_update_q8_cpu", "exp_avg");
  check_buffer(q.exp_avg_sq, "adam_update_q8_cpu", "exp_avg_sq");
  check_buffer(q.exp_avg_absmax, "adam_update_q8_cpu", "exp_avg_absmax");
  check_buffer(q.exp_avg_sq_absmax, "adam_update_q8_cpu", "exp_avg_sq_absmax");
  SHARDOPT_KERNEL_CHECK(!s.amsgrad, invalid_argument,
                        "adam_update_q8_cpu: amsgrad keeps max_exp_avg_sq, which has no 8-bit form");
  active_cpu_kernels().adam_update_q8(t, q, n, s, gt, r, threads);
}

void sgd_update_cpu(float* param, const float* grad, float* momentum_buf, int64_t n,
                    const SgdScalars& s, int threads) {
  const UpdateTensors t{param, grad, nullptr, DType::f32};
  sgd_update_cpu(t, momentum_buf, n, s, GradTransform{}, Rounding{}, threads);
}

void adam_update_cpu(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s, int threads) {
  const UpdateTensors t{param, grad, nullptr, DType::f32};
  adam_update_cpu(t, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, GradTransform{}, Rounding{}, threads);
}

GradStats grad_stats_cpu(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                         int threads) {
  if (n <= 0) return GradStats{};
  check_dtype(dtype, "grad_stats_cpu");
  check_buffer(grad, "grad_stats_cpu", "grad");
  return active_cpu_kernels().grad_stats(grad, dtype, n, unscale, inf_norm, threads);
}

void widen_cpu(const void* src, DType dtype, float* dst, int64_t n, int threads) {
  if (n <= 0) return;
  check_dtype(dtype, "widen_cpu");
  check_buffer(src, "widen_cpu", "src");
  check_buffer(dst, "widen_cpu", "dst");
  active_cpu_kernels().widen(src, dtype, dst, n, threads);
}

void narrow_cpu(const float* src, void* dst, DType dtype, int64_t n, int threads) {
  if (n <= 0) return;
  check_dtype(dtype, "narrow_cpu");
  check_buffer(src, "narrow_cpu", "src");
  check_buffer(dst, "narrow_cpu", "dst");
  active_cpu_kernels().narrow(src, dst, dtype, n, threads);
}

void divide_cpu(void* x, DType dtype, int64_t n, float divisor, int threads) {
  if (n <= 0) return;
  check_dtype(dtype, "divide_cpu");
  check_buffer(x, "divide_cpu", "x");
  active_cpu_kernels().divide(x, dtype, n, divisor, threads);
}

void average_slots_cpu(const void* const* inputs, int input_count, void* const* outputs, int output_count,
                       DType dtype, int64_t n, float divisor, int threads) {
  if (n <= 0 || output_count <= 0) return;
  check_dtype(dtype, "average_slots_cpu");
  check_buffer(inputs, "average_slots_cpu", "inputs");
  check_buffer(outputs, "average_slots_cpu", "outputs");
  SHARDOPT_KERNEL_CHECK(input_count >= 1 && input_count <= 64, invalid_argument, "average_slots_cpu: {} inputs (1 to 64 are taken)",
                        input_count);
  for (int i = 0; i < input_count; ++i) check_buffer(inputs[i], "average_slots_cpu", "inputs[i]");
  for (int j = 0; j < output_count; ++j) check_buffer(outputs[j], "average_slots_cpu", "outputs[j]");
  active_cpu_kernels().average_slots(inputs, input_count, outputs, output_count, dtype, n, divisor, threads);
}

// The bandwidth probes trust their callers (the benchmark), as they always have.

void stream_copy_cpu(const float* a, float* c, int64_t n, int threads) {
  active_cpu_kernels().stream_copy(a, c, n, threads);
}

void stream_triad_cpu(float* a, const float* b, const float* c, float s, int64_t n, int threads) {
  active_cpu_kernels().stream_triad(a, b, c, s, n, threads);
}

void fill_cpu(float* x, float value, int64_t n, int threads) { active_cpu_kernels().fill_f32(x, value, n, threads); }

void fill_cpu(uint16_t* x, uint16_t value, int64_t n, int threads) {
  active_cpu_kernels().fill_u16(x, value, n, threads);
}

void update_pattern_cpu(UpdatePattern pattern, float* p, const float* g, float* m, float* v, int64_t n,
                        int threads) {
  active_cpu_kernels().update_pattern(pattern, p, g, m, v, n, threads);
}

void update_pattern_half_cpu(UpdatePattern pattern, float* master, const uint16_t* g16, uint16_t* p16, float* m,
                             float* v, int64_t n, int threads) {
  active_cpu_kernels().update_pattern_half(pattern, master, g16, p16, m, v, n, threads);
}

}  // namespace kernels
}  // namespace shardopt
