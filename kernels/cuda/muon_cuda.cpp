// kernels/cuda/muon_cuda.cpp — Muon on CUDA: the workspace, Newton-Schulz as cuBLAS ssyrk/sgemm calls between the element-wise kernels, and error translation.
#include "cuda/muon_cuda.hpp"

#include <cuda_runtime.h>

#include <string>

#include "cuda/cublas_loader.hpp"
#include "cuda/muon_launchers.hpp"
#include "kernel_check.hpp"
#include "precision.hpp"

namespace shardopt {
namespace kernels {
namespace {

void check_launch(int status, const char* what) {
  const auto error = static_cast<cudaError_t>(status);
  if (error == cudaSuccess) return;
  raise_error(ErrorCode::cuda, "Muon on CUDA: {} failed: {} ({})", what, cudaGetErrorString(error),
              cudaGetErrorName(error));
}

void check_cublas(cublasStatus_t status, const char* what) {
  SHARDOPT_KERNEL_CHECK(status == CUBLAS_STATUS_SUCCESS, cuda, "Muon on CUDA: {} failed (cublasStatus_t {})", what,
                        static_cast<int>(status));
}

template <typename T>
T* device_alloc(int64_t count, const char* what) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, static_cast<std::size_t>(count) * sizeof(T));
  if (status != cudaSuccess) {
    cudaGetLastError();
    raise_error(ErrorCode::out_of_memory, "Muon on CUDA: cudaMalloc of {} ({} bytes) failed: {}", what,
                static_cast<std::size_t>(count) * sizeof(T), cudaGetErrorString(status));
  }
  return static_cast<T*>(p);
}

float round_bf16_host(float x) { return bf16_to_float(float_to_bf16(x)); }

// Newton-Schulz's iterations on the normalised m x n matrix ws.x (m <= n; cuBLAS sees X^T,
// n x m, leading dimension n) in fp32: ssyrk and sgemm.
void newton_schulz_f32_steps(const CublasTable& blas, cublasHandle_t handle, int mi, int ni, const MuonScalars& s,
                             MuonCudaWorkspace& ws, void* stream) {
  const int64_t m = mi, n = ni;
  constexpr bool bf16 = false;  // the epilogues round nothing
  const float one = 1.f, zero = 0.f;
  for (int step = 0; step < s.ns_steps; ++step) {
    // A = X X^T: (X^T)^T (X^T) in cuBLAS's terms, its upper triangle, mirrored.
    check_cublas(blas.ssyrk(handle, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, mi, ni, &one, ws.x, ni, &zero, ws.poly, mi),
                 "cublasSsyrk (X X^T)");
    check_launch(launch_muon_mirror(ws.poly, m, stream), "mirroring X X^T");
    check_launch(launch_muon_epilogue(nullptr, 0.f, ws.poly, 1.f, m * m, ws.gram, bf16, stream), "rounding A");
    // B = b A + c A A, with A A = A A^T for the exactly symmetric A.
    check_cublas(blas.ssyrk(handle, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, mi, mi, &one, ws.gram, mi, &zero, ws.next, mi),
                 "cublasSsyrk (A A)");
    check_launch(launch_muon_mirror(ws.next, m, stream), "mirroring A A");
    check_launch(launch_muon_epilogue(ws.gram, s.ns[1], ws.next, s.ns[2], m * m, ws.poly, bf16, stream), "forming B");
    // X = a X + B X; transposed for cuBLAS: X^T B^T = X^T B (B symmetric), n x m.
    check_cublas(blas.sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, mi, &one, ws.x, ni, ws.poly, mi, &zero, ws.next, ni),
                 "cublasSgemm (B X)");
    check_launch(launch_muon_epilogue(ws.x, s.ns[0], ws.next, 1.f, m * n, ws.x, bf16, stream), "forming X");
  }
}

// The same iterations with bf16 operands: each product reads the bf16 bits of its (already
// bf16-rounded) inputs and writes fp32, which the epilogue rounds to bf16 as in fp32 mode.
// cuBLAS has no bf16 syrk: A = X X^T and A A are full products, mirrored from their upper
// triangles so that A and A A are exactly symmetric, as the fp32 path's.
void newton_schulz_bf16_steps(const CublasTable& blas, cublasHandle_t handle, int mi, int ni, const MuonScalars& s,
                              MuonCudaWorkspace& ws, void* stream) {
  const int64_t m = mi, n = ni;
  const float one = 1.f, zero = 0.f;
  const auto gemm = [&](cublasOperation_t op_a, cublasOperation_t op_b, int rows, int cols, int depth,
                        const uint16_t* a, int lda, const uint16_t* b, int ldb, float* c, int ldc, const char* what) {
    check_cublas(blas.gemm_ex(handle, op_a, op_b, rows, cols, depth, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                              &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 what);
  };
  check_launch(launch_muon_to_bf16(ws.x, ws.x_bf16, m * n, stream), "X in bf16");
  for (int step = 0; step < s.ns_steps; ++step) {
    // A = X X^T = (X^T)^T (X^T), mirrored from its upper triangle.
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, mi, mi, ni, ws.x_bf16, ni, ws.x_bf16, ni, ws.poly, mi, "cublasGemmEx (X X^T)");
    check_launch(launch_muon_mirror(ws.poly, m, stream), "mirroring X X^T");
    check_launch(launch_muon_epilogue(nullptr, 0.f, ws.poly, 1.f, m * m, ws.gram, true, stream), "rounding A");
    check_launch(launch_muon_to_bf16(ws.gram, ws.gram_bf16, m * m, stream), "A in bf16");
    // B = b A + c A A.
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, mi, mi, mi, ws.gram_bf16, mi, ws.gram_bf16, mi, ws.next, mi, "cublasGemmEx (A A)");
    check_launch(launch_muon_mirror(ws.next, m, stream), "mirroring A A");
    check_launch(launch_muon_epilogue(ws.gram, s.ns[1], ws.next, s.ns[2], m * m, ws.poly, true, stream), "forming B");
    check_launch(launch_muon_to_bf16(ws.poly, ws.poly_bf16, m * m, stream), "B in bf16");
    // X = a X + B X; transposed for cuBLAS: X^T B (B symmetric), n x m.
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, mi, ws.x_bf16, ni, ws.poly_bf16, mi, ws.next, ni, "cublasGemmEx (B X)");
    check_launch(launch_muon_epilogue(ws.x, s.ns[0], ws.next, 1.f, m * n, ws.x, true, stream), "forming X");
    check_launch(launch_muon_to_bf16(ws.x, ws.x_bf16, m * n, stream), "X in bf16");
  }
}

}  // namespace

MuonCudaWorkspace::~MuonCudaWorkspace() {
  release();
  if (squares != nullptr) cudaFree(squares);
  if (cublas != nullptr && cublas_load_failure().empty()) {
    cublas_table("Muon on CUDA").destroy(static_cast<cublasHandle_t>(cublas));
  }
}

void MuonCudaWorkspace::release() {
  for (void* p : {static_cast<void*>(update), static_cast<void*>(x), static_cast<void*>(next),
                  static_cast<void*>(gram), static_cast<void*>(poly), static_cast<void*>(x_bf16),
                  static_cast<void*>(gram_bf16), static_cast<void*>(poly_bf16)}) {
    if (p != nullptr) cudaFree(p);
  }
  update = x = next = gram = poly = nullptr;
  x_bf16 = gram_bf16 = poly_bf16 = nullptr;
  matrix_capacity_ = gram_capacity_ = 0;
}

void MuonCudaWorkspace::reserve(int64_t rows, int64_t cols, void* stream) {
  const CublasTable& blas = cublas_table("Muon on CUDA");
  if (cublas == nullptr) {
    cublasHandle_t handle = nullptr;
    check_cublas(blas.create(&handle), "cublasCreate");
    cublas = handle;
  }
  if (squares == nullptr) squares = device_alloc<double>(1, "the norm");
  const int64_t matrix = rows * cols;
  const int64_t small = rows < cols ? rows : cols;
  const int64_t gram_elements = small * small;
  if (matrix <= matrix_capacity_ && gram_elements <= gram_capacity_) return;
  const int64_t keep_matrix = matrix > matrix_capacity_ ? matrix : matrix_capacity_;
  const int64_t keep_gram = gram_elements > gram_capacity_ ? gram_elements : gram_capacity_;
  check_launch(static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))),
               "waiting for the stream before growing the scratch");
  release();
  update = device_alloc<float>(keep_matrix, "the update");
  x = device_alloc<float>(keep_matrix, "the working matrix");
  next = device_alloc<float>(keep_matrix, "the product");
  gram = device_alloc<float>(keep_gram, "the Gram matrix");
  poly = device_alloc<float>(keep_gram, "the Gram polynomial");
  x_bf16 = device_alloc<uint16_t>(keep_matrix, "the working matrix in bf16");
  gram_bf16 = device_alloc<uint16_t>(keep_gram, "the Gram matrix in bf16");
  poly_bf16 = device_alloc<uint16_t>(keep_gram, "the Gram polynomial in bf16");
  matrix_capacity_ = keep_matrix;
  gram_capacity_ = keep_gram;
}

void newton_schulz_cuda(const float* g, float* out, int64_t rows, int64_t cols, const MuonScalars& s,
                        MuonPrecision precision, MuonCudaWorkspace& ws, void* stream) {
  SHARDOPT_KERNEL_CHECK(rows > 0 && cols > 0 && rows <= INT32_MAX && cols <= INT32_MAX, invalid_argument,
                        "newton_schulz_cuda: a {} x {} matrix (each side must be in [1, 2^31))", rows, cols);
  ws.reserve(rows, cols, stream);
  const CublasTable& blas = cublas_table("Muon on CUDA");
  const auto handle = static_cast<cublasHandle_t>(ws.cublas);
  check_cublas(blas.set_stream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  const bool bf16 = precision == MuonPrecision::bf16;
  // The wide orientation (m <= n), row-major m x n: as cuBLAS (column-major) sees it, the
  // n x m matrix X^T with leading dimension n.
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;
  const int64_t n = tall ? rows : cols;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n);
  check_launch(launch_muon_copy(g, ws.x, rows, cols, tall, bf16, stream), "copying the matrix in");
  check_launch(launch_muon_sum_squares(ws.x, m * n, ws.squares, stream), "the Frobenius norm");
  const float floor = bf16 ? round_bf16_host(s.eps) : s.eps;
  check_launch(launch_muon_normalize(ws.x, m * n, ws.squares, floor, bf16, stream), "normalising");
  if (bf16) {
    // bf16 operands on the tensor cores with fp32 sums; no reduced-precision reductions.
    check_cublas(blas.set_math_mode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                 "cublasSetMathMode(no reduced-precision reductions)");
    newton_schulz_bf16_steps(blas, handle, mi, ni, s, ws, stream);
  } else {
    // No TF32 and no reduced-precision reductions: fp32 products whatever the GPU prefers.
    check_cublas(blas.set_math_mode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode(CUBLAS_PEDANTIC_MATH)");
    newton_schulz_f32_steps(blas, handle, mi, ni, s, ws, stream);
  }
  // Back to rows x cols (a tall matrix was worked on transposed); no rounding on the way out.
  check_launch(launch_muon_copy(ws.x, out, m, n, tall, false, stream), "copying the result out");
}

void muon_update_cuda(const UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols, const MuonScalars& s,
                      const GradTransform& gt, const Rounding& rounding, MuonPrecision precision,
                      MuonCudaWorkspace& ws, void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  SHARDOPT_KERNEL_CHECK(t.param != nullptr && t.grad != nullptr && momentum_buf != nullptr, invalid_argument,
                        "muon_update_cuda: a null buffer");
  SHARDOPT_KERNEL_CHECK((t.dtype == DType::f32) == (t.master == nullptr), invalid_argument,
                        "muon_update_cuda: a master is required for bf16/f16 parameters and refused for f32");
  SHARDOPT_KERNEL_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, invalid_argument,
                        "muon_update_cuda: unsupported dtype {}", dtype_name(t.dtype));
  ws.reserve(rows, cols, stream);
  check_launch(launch_muon_momentum(t.grad, t.dtype, momentum_buf, ws.update, n, gt, s.momentum, s.one_minus_momentum,
                                    s.nesterov, stream),
               "the momentum");
  newton_schulz_cuda(ws.update, ws.update, rows, cols, s, precision, ws, stream);
  check_launch(launch_muon_apply(t.param, t.master, t.dtype, ws.update, n, s.decay, s.neg_adjusted_lr,
                                 rounding.stochastic, rounding_step_key(rounding.seed, rounding.step),
                                 rounding.first_index, stream),
               "the update");
}

}  // namespace kernels
}  // namespace shardopt
