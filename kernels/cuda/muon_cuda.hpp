// kernels/cuda/muon_cuda.hpp — Muon's update of one whole matrix on CUDA: momentum, Newton-Schulz on cuBLAS (fp32: pedantic sgemm/ssyrk; bf16: bf16 operands on the tensor cores, fp32 sums), decay and the shape-adjusted step.
//
// The contract of muon_cpu.hpp on device memory: every element-wise step is the CPU kernel's
// (the same helpers, no FMA contraction). The products: in fp32, cuBLAS sgemm/ssyrk in
// CUBLAS_PEDANTIC_MATH (no TF32, no reduced-precision reductions); in bf16, cublasGemmEx with
// bf16 operands (the bf16-rounded values the CPU multiplies, exactly) and fp32 results and
// sums (CUBLAS_COMPUTE_32F, reduced-precision reductions disallowed), rounded to bf16 by the
// same epilogue as the CPU's: torch's bf16 Newton-Schulz, at the tensor cores' speed. For one
// GPU model and build the bits are the same at every run; against the CPU they differ only by
// the products' summation order (tests/gpu: within the parity tolerance). Everything is enqueued on `stream`
// (a cudaStream_t as void*, null: the legacy default stream); nothing waits for the device.
// Only in a build with CUDA (SHARDOPT_HAVE_CUDA); cuBLAS is loaded at run time
// (cublas_loader.hpp): where it cannot be, Error(unsupported) says so.
#pragma once

#include <cstdint>

#include "cpu/muon_cpu.hpp"

namespace shardopt {
namespace kernels {

// Device scratch for one matrix's orthogonalisation and a cuBLAS handle, grown to the largest
// matrix and kept (the first step allocates, later ones do not); freed by the destructor. Used
// by one thread at a time, on the device that was current when it first grew.
class MuonCudaWorkspace {
 public:
  MuonCudaWorkspace() = default;
  ~MuonCudaWorkspace();
  MuonCudaWorkspace(const MuonCudaWorkspace&) = delete;
  MuonCudaWorkspace& operator=(const MuonCudaWorkspace&) = delete;

  // Room for a rows x cols matrix (its update, the working copy, the product and the two m x m
  // Gram matrices, the norm) and the handle. Growing waits for `stream` (where the earlier
  // matrices' work that reads the old buffers was enqueued) before freeing them: the first
  // steps only, as the buffers grow to the largest matrix.
  void reserve(int64_t rows, int64_t cols, void* stream);

  float* update = nullptr;
  float* x = nullptr;
  float* next = nullptr;
  float* gram = nullptr;
  float* poly = nullptr;
  // The bf16 path's product operands: X, A and B as bf16 bits (the values above, exactly).
  uint16_t* x_bf16 = nullptr;
  uint16_t* gram_bf16 = nullptr;
  uint16_t* poly_bf16 = nullptr;
  double* squares = nullptr;  // the sum of squares of the normalised matrix, on the device
  void* cublas = nullptr;     // cublasHandle_t

 private:
  void release();
  int64_t matrix_capacity_ = 0;
  int64_t gram_capacity_ = 0;
};

// torch.optim.Muon's _zeropower_via_newtonschulz of the rows x cols row-major device matrix `g`
// into `out` (both f32 device memory; they may alias).
void newton_schulz_cuda(const float* g, float* out, int64_t rows, int64_t cols, const MuonScalars& s,
                        MuonPrecision precision, MuonCudaWorkspace& ws, void* stream);

// One Muon step of a rows x cols device matrix (muon_update_cpu's contract): grad into the
// momentum buffer by lerp, the Nesterov blend, Newton-Schulz, param = param * decay +
// neg_adjusted_lr * update, written to bf16/f16 parameters from the master with `rounding`.
void muon_update_cuda(const UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols, const MuonScalars& s,
                      const GradTransform& gt, const Rounding& rounding, MuonPrecision precision,
                      MuonCudaWorkspace& ws, void* stream);

}  // namespace kernels
}  // namespace shardopt
