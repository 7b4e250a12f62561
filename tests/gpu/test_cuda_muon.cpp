// tests/gpu/test_cuda_muon.cpp — Muon on CUDA (cuBLAS Newton-Schulz, the element-wise kernels) against kernels/cpu's Muon, within the products' reordering tolerance.
//
// The element-wise steps are the CPU kernel's code (muon_rules.hpp, no FMA contraction), so the
// momentum buffers agree bitwise; the products are cuBLAS's and OpenBLAS's fp32 sums in their
// own orders, so the orthogonalised matrices and parameters agree within a tolerance: fp32 a
// few ulps of the largest entry amplified by the iteration (1e-4 of it), bf16 a few bf16 steps
// (3e-2 of it: a rounding flipped by a reordered sum propagates through the five steps). A
// transposed or mis-strided product is off by O(1) and fails both.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/muon_cpu.hpp"
#include "cuda/muon_cuda.hpp"
#include "gpu_test_support.hpp"
#include "precision.hpp"

namespace {

using namespace shardopt::kernels;
using shardopt::DType;
using shardopt_test::DeviceArray;
using shardopt_test::TestStream;

std::vector<float> random_values(std::mt19937& gen, std::size_t n, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = dist(gen);
  return values;
}

// max |a - b| over max |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::fabs(static_cast<double>(a[i]) - b[i]));
    largest = std::max(largest, std::fabs(static_cast<double>(b[i])));
  }
  return largest > 0 ? gap / largest : gap;
}

struct Shape {
  int64_t rows, cols;
};
const Shape kShapes[] = {{64, 64}, {96, 40}, {40, 96}, {1, 33}, {33, 1}, {257, 130}};

double tolerance(MuonPrecision precision) { return precision == MuonPrecision::f32 ? 1e-4 : 3e-2; }

MuonScalars scalars(bool nesterov, int64_t rows, int64_t cols) {
  return make_muon_scalars(0.02, 0.1, 0.95, nesterov, {3.4445, -4.775, 2.0315}, 5, 1e-7, 1, rows, cols);
}

}  // namespace

TEST_CASE("newton_schulz_cuda matches newton_schulz_cpu in f32 and bf16, tall, wide and square", "[cuda][muon]") {
  std::mt19937 gen(7);
  TestStream stream;
  MuonCudaWorkspace ws;
  MuonWorkspace cpu_ws;
  for (const Shape& shape : kShapes) {
    for (MuonPrecision precision : {MuonPrecision::f32, MuonPrecision::bf16}) {
      const auto n = static_cast<std::size_t>(shape.rows * shape.cols);
      const std::vector<float> g = random_values(gen, n, 0.5f);
      const MuonScalars s = scalars(true, shape.rows, shape.cols);
      std::vector<float> want(n);
      newton_schulz_cpu(g.data(), want.data(), shape.rows, shape.cols, s, precision, 1, cpu_ws);
      DeviceArray<float> in(n), out(n);
      in.upload(g);
      newton_schulz_cuda(in.data(), out.data(), shape.rows, shape.cols, s, precision, ws, stream.opaque());
      stream.sync();
      const std::vector<float> got = out.download(0, n);
      const double gap = relative_gap(got, want);
      INFO(shape.rows << " x " << shape.cols << (precision == MuonPrecision::f32 ? " f32" : " bf16") << ": gap "
                      << gap);
      CHECK(gap <= tolerance(precision));
      // In place, as muon_update_cuda calls it: the same bits as out of place.
      newton_schulz_cuda(in.data(), in.data(), shape.rows, shape.cols, s, precision, ws, stream.opaque());
      stream.sync();
      const std::vector<float> in_place = in.download(0, n);
      CHECK(std::memcmp(in_place.data(), got.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("muon_update_cuda steps f32 and bf16 parameters as muon_update_cpu does", "[cuda][muon]") {
  std::mt19937 gen(11);
  TestStream stream;
  MuonCudaWorkspace ws;
  MuonWorkspace cpu_ws;
  const Shape shape{80, 48};
  const auto n = static_cast<std::size_t>(shape.rows * shape.cols);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool nesterov : {true, false}) {
      const MuonScalars s = scalars(nesterov, shape.rows, shape.cols);
      const MuonPrecision precision = MuonPrecision::bf16;
      std::vector<float> master = random_values(gen, n, 0.05f);
      std::vector<float> momentum(n, 0.f);
      std::vector<uint16_t> param16(n);
      for (std::size_t i = 0; i < n; ++i) {
        param16[i] = float_to_bf16(master[i]);
        if (dtype == DType::f32) master[i] = bf16_to_float(param16[i]);  // the same start either way
      }
      DeviceArray<float> d_master(n), d_momentum(n), d_grad32(n);
      DeviceArray<uint16_t> d_param16(n), d_grad16(n);
      d_master.upload(master);
      d_momentum.upload(momentum);
      d_param16.upload(param16);
      for (int step = 1; step <= 3; ++step) {
        const std::vector<float> grad = random_values(gen, n, 0.01f);
        std::vector<uint16_t> grad16(n);
        for (std::size_t i = 0; i < n; ++i) grad16[i] = float_to_bf16(grad[i]);
        Rounding rounding;
        rounding.step = static_cast<uint64_t>(step);
        UpdateTensors cpu, dev;
        cpu.dtype = dev.dtype = dtype;
        if (dtype == DType::f32) {
          cpu.param = master.data();
          cpu.grad = grad.data();
          d_grad32.upload(grad);
          dev.param = d_master.data();
          dev.grad = d_grad32.data();
        } else {
          cpu.param = param16.data();
          cpu.grad = grad16.data();
          cpu.master = master.data();
          d_grad16.upload(grad16);
          dev.param = d_param16.data();
          dev.grad = d_grad16.data();
          dev.master = d_master.data();
        }
        muon_update_cpu(cpu, momentum.data(), shape.rows, shape.cols, s, GradTransform{}, rounding, precision, 1,
                        cpu_ws);
        muon_update_cuda(dev, d_momentum.data(), shape.rows, shape.cols, s, GradTransform{}, rounding, precision, ws,
                         stream.opaque());
        stream.sync();
        INFO((dtype == DType::f32 ? "f32" : "bf16") << (nesterov ? " nesterov" : "") << " step " << step);
        // The momentum is element-wise and the same code: bitwise (the masters' gaps come from
        // the products, and do not feed back into the momentum).
        const std::vector<float> got_momentum = d_momentum.download(0, n);
        CHECK(std::memcmp(got_momentum.data(), momentum.data(), n * sizeof(float)) == 0);
        // Each step moves a parameter by at most |adjusted lr| x |update| (<= ~1): compare the
        // masters' difference with a few bf16 steps of that movement per step taken.
        const std::vector<float> got = d_master.download(0, n);
        double gap = 0.0;
        for (std::size_t i = 0; i < n; ++i) gap = std::max(gap, std::fabs(static_cast<double>(got[i]) - master[i]));
        const double allowed = 3e-2 * std::fabs(s.neg_adjusted_lr) * step;
        INFO("gap " << gap << ", allowed " << allowed);
        CHECK(gap <= allowed);
      }
    }
  }
}
