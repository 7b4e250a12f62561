// kernels/cpu/muon_cpu.hpp — torch.optim.Muon's update of one whole matrix on the CPU: momentum, Newton-Schulz on OpenBLAS, decoupled decay and the shape-adjusted step.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "cpu/amx_bf16_gemm.hpp"
#include "cpu/cache_line_allocator.hpp"
#include "mixed_update.hpp"

namespace shardopt {
namespace kernels {

// Per-matrix scalars, computed on the host as torch does (Python doubles, cast to float where
// torch hands them to a float kernel).
struct MuonScalars {
  float momentum = 0.95f;        // lerp weight of the Nesterov blend
  float one_minus_momentum = 0.05f;  // buf.lerp_(grad, 1 - momentum)
  bool nesterov = true;
  std::array<float, 3> ns{3.4445f, -4.775f, 2.0315f};  // a, b, c
  int ns_steps = 5;
  float eps = 1e-7f;
  float decay = 1.f;           // 1 - lr * weight_decay
  float neg_adjusted_lr = 0.f;  // -lr * the shape's ratio
};

// lr * sqrt(max(1, rows / cols)) (adjust 0 = none, 1 = original), lr * 0.2 * sqrt(max(rows,
// cols)) (2 = match_rms_adamw), lr * sqrt(rows / cols) (3 = spectral_unclamped):
// torch.optim.Muon's _adjust_lr, in double.
double muon_adjusted_lr(double lr, int adjust, int64_t rows, int64_t cols);
MuonScalars make_muon_scalars(double lr, double weight_decay, double momentum, bool nesterov,
                              const std::array<double, 3>& ns, int ns_steps, double eps, int adjust,
                              int64_t rows, int64_t cols);

// Scratch for one matrix's orthogonalisation; grows to the largest matrix and is kept.
struct MuonWorkspace {
  std::vector<float, CacheLineAllocator<float>> x, next, gram, poly;  // whole lines for the products' loads
  AmxScratch amx;  // packed bf16 operands where the bf16 products run on AMX tiles
  // Wall time spent in newton_schulz_cpu since the owner last read and cleared it.
  double newton_schulz_seconds = 0.0;
};

// Emulated precision of the products (see MatrixPrecision in shardopt/optimizer.hpp).
enum class MuonPrecision : int32_t { bf16 = 0, f32 = 1 };

// Whether bf16 Newton-Schulz products run on AMX tiles (amx_bf16_gemm) in this process: where
// the CPU and OS have them and SHARDOPT_CPU_ISA is unset or "auto"; else OpenBLAS's sgemm of the
// bf16 values. Both accumulate exact bf16 products in fp32; the bits differ in summation order.
bool bf16_products_on_amx();

// Orthogonalises the rows x cols row-major matrix `g` into `out` (both f32; they may alias):
// torch.optim.Muon's _zeropower_via_newtonschulz. Every sgemm runs on `blas_threads` OpenBLAS
// threads (OpenBLAS's process-wide setting, set for the call and restored after it).
void newton_schulz_cpu(const float* g, float* out, int64_t rows, int64_t cols, const MuonScalars& s,
                       MuonPrecision precision, int blas_threads, MuonWorkspace& ws);

// One Muon step of a rows x cols matrix: grad (dtype, transformed: unscaled and clipped) into
// the momentum buffer by lerp, the Nesterov blend, Newton-Schulz, then
// param = param * decay + neg_adjusted_lr * update, written to bf16/f16 parameters from the
// master with `rounding` (first_index: the matrix's first element).
void muon_update_cpu(const UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols,
                     const MuonScalars& s, const GradTransform& gt, const Rounding& rounding,
                     MuonPrecision precision, int blas_threads, MuonWorkspace& ws);

}  // namespace kernels
}  // namespace shardopt
