// kernels/cpu/muon_cpu.cpp — Muon on the CPU: momentum by lerp, Newton-Schulz over OpenBLAS (fp32, or bf16 emulated as torch runs it; bf16 products on AMX tiles where the CPU has them), and the decoupled update.
#include "cpu/muon_cpu.hpp"

#include "cpu/blas_core.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include <strings.h>

#include <cblas.h>

#include "muon_rules.hpp"
#include "precision.hpp"
#include "kernel_check.hpp"

namespace shardopt {
namespace kernels {
namespace {

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// OpenBLAS's thread count is process-wide: set for the orthogonalisation, then given back, so a
// trainer's own BLAS calls (the demo's MLP) keep theirs.
class BlasThreads {
 public:
  explicit BlasThreads(int threads) : before_(openblas_get_num_threads()) { openblas_set_num_threads(threads); }
  ~BlasThreads() { openblas_set_num_threads(before_); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int before_;
};

// bf16 products on AMX tiles where this process has them, unless SHARDOPT_CPU_ISA forces a
// variant: then they stay OpenBLAS's sgemm of bf16 values, as on CPUs without AMX.
bool compute_bf16_products_on_amx() {
  const char* forced = std::getenv("SHARDOPT_CPU_ISA");
  const bool automatic = forced == nullptr || *forced == '\0' || strcasecmp(forced, "auto") == 0;
  return automatic && amx_bf16_usable();
}

void keep_bf16(float* x, int64_t n, MuonPrecision precision) {
  if (precision != MuonPrecision::bf16) return;
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

// out = beta * c + alpha * product, element by element in fp32 (no fused multiply-add), then
// rounded to bf16 where emulated; without `c`, out = product. `c` may alias `out`.
void epilogue(const float* c, float beta, const float* product, float alpha, int64_t count, float* out,
              MuonPrecision precision) {
  // One pass each: the bf16 rounding in the same loop as the arithmetic.
  const bool bf16 = precision == MuonPrecision::bf16;
  if (c == nullptr && bf16) {
    for (int64_t i = 0; i < count; ++i) out[i] = round_bf16(product[i]);
  } else if (c == nullptr) {
    for (int64_t i = 0; i < count; ++i) out[i] = product[i];
  } else if (bf16) {
    for (int64_t i = 0; i < count; ++i) out[i] = round_bf16(beta * c[i] + alpha * product[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = beta * c[i] + alpha * product[i];
  }
}

// product = a @ b (m x k times k x n, row-major) in one sgemm (fp32 accumulation).
void matmul(const float* a, const float* b, int64_t m, int64_t n, int64_t k, float* product) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.f, a, static_cast<int>(k), b, static_cast<int>(n), 0.f, product,
              static_cast<int>(n));
}

// product = a @ a^T (a is m x k, row-major): one ssyrk computes the upper triangle (half an
// sgemm's flops), mirrored into the lower, so the result is exactly symmetric. Newton-Schulz
// needs two such products per step: X X^T, and A A = A A^T for the symmetric A.
void gram_matrix(const float* a, int64_t m, int64_t k, float* product) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, static_cast<int>(m), static_cast<int>(k), 1.f, a,
              static_cast<int>(k), 0.f, product, static_cast<int>(m));
  for (int64_t r = 1; r < m; ++r) {
    for (int64_t c = 0; c < r; ++c) product[r * m + c] = product[c * m + r];
  }
}

}  // namespace

bool bf16_products_on_amx() {
  static std::once_flag once;
  static bool on = false;
  std::call_once(once, [] { on = compute_bf16_products_on_amx(); });
  return on;
}

double muon_adjusted_lr(double lr, int adjust, int64_t rows, int64_t cols) {
  const double a = static_cast<double>(rows);
  const double b = static_cast<double>(cols);
  double ratio = 1.0;
  if (adjust == 0 || adjust == 1) {
    ratio = std::sqrt(std::max(1.0, a / b));
  } else if (adjust == 2) {
    ratio = 0.2 * std::sqrt(std::max(a, b));
  } else if (adjust == 3) {
    ratio = std::sqrt(a / b);
  }
  return lr * ratio;
}

MuonScalars make_muon_scalars(double lr, double weight_decay, double momentum, bool nesterov,
                              const std::array<double, 3>& ns, int ns_steps, double eps, int adjust, int64_t rows,
                              int64_t cols) {
  MuonScalars s;
  s.momentum = static_cast<float>(momentum);
  s.one_minus_momentum = static_cast<float>(1.0 - momentum);
  s.nesterov = nesterov;
  for (std::size_t i = 0; i < 3; ++i) s.ns[i] = static_cast<float>(ns[i]);
  s.ns_steps = ns_steps;
  s.eps = static_cast<float>(eps);
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.neg_adjusted_lr = static_cast<float>(-muon_adjusted_lr(lr, adjust, rows, cols));
  return s;
}

void newton_schulz_cpu(const float* g, float* out, int64_t rows, int64_t cols, const MuonScalars& s,
                       MuonPrecision precision, int blas_threads, MuonWorkspace& ws) {
  SHARDOPT_KERNEL_CHECK(rows > 0 && cols > 0 && rows <= INT32_MAX && cols <= INT32_MAX, invalid_argument,
                 "newton_schulz_cpu: a {} x {} matrix (each side must be in [1, 2^31))", rows, cols);
  ensure_blas_core();  // once per process: out of an OpenBLAS fallback core before the first product
  const auto started = std::chrono::steady_clock::now();
  const BlasThreads scope(blas_threads);
  // Work on the wide orientation (m <= n), as torch transposes a tall matrix.
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;
  const int64_t n = tall ? rows : cols;
  ws.x.resize(static_cast<std::size_t>(m * n));
  ws.gram.resize(static_cast<std::size_t>(m * m));
  ws.poly.resize(static_cast<std::size_t>(m * m));
  float* x = ws.x.data();
  if (tall) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) x[c * rows + r] = g[r * cols + c];
    }
  } else {
    std::copy(g, g + m * n, x);
  }
  keep_bf16(x, m * n, precision);  // torch: grad.bfloat16()
  // x /= max(||x||_F, eps): the norm accumulated in double, rounded to the working precision.
  double squares = 0.0;
  for (int64_t i = 0; i < m * n; ++i) squares += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  float norm = static_cast<float>(std::sqrt(squares));
  float floor = s.eps;
  if (precision == MuonPrecision::bf16) {
    norm = round_bf16(norm);
    floor = round_bf16(floor);
  }
  norm = std::max(norm, floor);
  for (int64_t i = 0; i < m * n; ++i) x[i] = x[i] / norm;
  keep_bf16(x, m * n, precision);
  float* gram = ws.gram.data();
  float* poly = ws.poly.data();
  const bool amx = precision == MuonPrecision::bf16 && bf16_products_on_amx();
  if (amx) {
    for (int step = 0; step < s.ns_steps; ++step) {
      // On AMX tiles each epilogue runs on a block as it leaves the tiles, straight into its
      // destination: the same fp32 operations and rounding as the separate passes below.
      const AmxEpilogue round_only{};
      amx_bf16_gemm(x, x, true, m, m, n, true, gram, ws.amx, &round_only);             // A = X X^T
      const AmxEpilogue polynomial{gram, s.ns[1], s.ns[2]};
      amx_bf16_gemm(gram, gram, true, m, m, m, true, poly, ws.amx, &polynomial);      // B = b A + c A A
      const AmxEpilogue next_x{x, s.ns[0], 1.f};
      amx_bf16_gemm(poly, x, false, m, n, m, false, x, ws.amx, &next_x);              // X = a X + B X
    }
  } else {
    // The unfused path needs the product apart from its destination.
    ws.next.resize(static_cast<std::size_t>(m * n));
    float* next = ws.next.data();
    for (int step = 0; step < s.ns_steps; ++step) {
      // A = X X^T
      gram_matrix(x, m, n, poly);
      epilogue(nullptr, 0.f, poly, 1.f, m * m, gram, precision);
      // B = b A + c A A
      gram_matrix(gram, m, m, next);
      epilogue(gram, s.ns[1], next, s.ns[2], m * m, poly, precision);
      // X = a X + B X
      matmul(poly, x, m, n, m, next);
      epilogue(x, s.ns[0], next, 1.f, m * n, x, precision);
    }
  }
  if (tall) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = x[c * rows + r];
    }
  } else {
    std::copy(x, x + m * n, out);
  }
  ws.newton_schulz_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void muon_update_cpu(const UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols, const MuonScalars& s,
                     const GradTransform& gt, const Rounding& rounding, MuonPrecision precision, int blas_threads,
                     MuonWorkspace& ws) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  SHARDOPT_KERNEL_CHECK(t.param != nullptr && t.grad != nullptr && momentum_buf != nullptr, invalid_argument,
                 "muon_update_cpu: a null buffer");
  SHARDOPT_KERNEL_CHECK((t.dtype == DType::f32) == (t.master == nullptr), invalid_argument,
                 "muon_update_cpu: a master is required for bf16/f16 parameters and refused for f32");
  std::vector<float> update(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float g = 0.f;
    switch (t.dtype) {
      case DType::f32: g = static_cast<const float*>(t.grad)[i]; break;
      case DType::bf16: g = bf16_to_float(static_cast<const uint16_t*>(t.grad)[i]); break;
      case DType::f16: g = f16_to_float(static_cast<const uint16_t*>(t.grad)[i]); break;
      default: raise_error(ErrorCode::invalid_argument, "muon_update_cpu: unsupported dtype {}", dtype_name(t.dtype));
    }
    if (!is_identity(gt)) g = transform_grad(g, gt);
    update[static_cast<std::size_t>(i)] =
        muon_momentum(momentum_buf[i], g, s.momentum, s.one_minus_momentum, s.nesterov);
  }
  newton_schulz_cpu(update.data(), update.data(), rows, cols, s, precision, blas_threads, ws);
  float* values = t.dtype == DType::f32 ? static_cast<float*>(t.param) : t.master;
  for (int64_t i = 0; i < n; ++i) {
    const float decayed = values[i] * s.decay;                                  // param.mul_(1 - lr * wd)
    values[i] = decayed + s.neg_adjusted_lr * update[static_cast<std::size_t>(i)];  // param.add_(u, alpha=-lr')
  }
  if (t.dtype == DType::f32) return;
  uint16_t* out = static_cast<uint16_t*>(t.param);
  const uint32_t key = rounding_step_key(rounding.seed, rounding.step);
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i];
    if (rounding.stochastic) {
      const uint32_t random = rounding_random_keyed(key, rounding.first_index + static_cast<uint64_t>(i));
      out[i] = t.dtype == DType::bf16 ? float_to_bf16_stochastic(v, random) : float_to_f16_stochastic(v, random);
    } else {
      out[i] = t.dtype == DType::bf16 ? float_to_bf16(v) : float_to_f16(v);
    }
  }
}

}  // namespace kernels
}  // namespace shardopt
