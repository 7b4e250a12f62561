// tests/gpu/test_cuda_mixed_kernels.cpp — the CUDA mixed-precision updates, grad_stats and dtype conversions against kernels/cpu, bitwise.
//
// Parity holds because both sides run the same per-element code (kernels/precision.hpp and
// mixed_update.hpp, integer conversions, rules without FMA contraction) and grad_stats sums in
// the fixed order of kernels/grad_stats.hpp on both.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "cuda/update_cuda.hpp"
#include "gpu_test_support.hpp"

namespace {

using namespace shardopt::kernels;
using shardopt::DType;
using shardopt_test::DeviceArray;
using shardopt_test::TestStream;

std::vector<float> random_values(std::mt19937& gen, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(gen);
  return values;
}

std::vector<uint16_t> narrowed(const std::vector<float>& x, DType dtype) {
  std::vector<uint16_t> out(x.size());
  narrow_cpu(x.data(), out.data(), dtype, static_cast<int64_t>(x.size()), 1);
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

const int64_t kSizes[] = {0, 1, 3, 4, 5, 31, 257, 1037, 4097, (1 << 20) + 5};

// Element offsets of (param, grad, master, state 0, 1, 2) in their allocations: in step (the
// vector body after a head), 16-bit streams out of step with the floats, a float stream out
// of step.
const int kOffsets[][6] = {{0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {3, 3, 3, 3, 3, 3},
                           {1, 0, 0, 0, 0, 0}, {0, 0, 2, 0, 0, 0}, {2, 2, 2, 2, 2, 3}};

struct RuleCase {
  const char* name;
  bool adam;
  AdamScalars adam_scalars;
  SgdScalars sgd_scalars;
};

std::vector<RuleCase> rule_cases(int64_t step) {
  return {
      {"adamw-amsgrad", true, make_adam_scalars(1e-2, 0.9, 0.999, 1e-8, 0.01, true, true, false, step), {}},
      {"adam-l2-maximize", true, make_adam_scalars(1e-3, 0.8, 0.99, 1e-6, 0.1, false, false, true, step), {}},
      {"sgd-momentum", false, {}, make_sgd_scalars(0.05, 0.9, 0.1, 0.01, false, false, step == 1)},
      {"sgd", false, {}, make_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, false, true)},
  };
}

}  // namespace

TEST_CASE("mixed sgd/adam on the device equal the CPU loops bitwise", "[gpu][mixed]") {
  TestStream stream;
  std::mt19937 gen(404);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool stochastic : {false, true}) {
      if (dtype == DType::f32 && stochastic) continue;
      for (int64_t n : kSizes) {
        for (const auto& off : kOffsets) {
          for (int rule_index = 0; rule_index < 4; ++rule_index) {
            CAPTURE(shardopt::dtype_name(dtype), stochastic, n, off[0], off[1], off[2], off[3], rule_index);
            const std::size_t count = static_cast<std::size_t>(n);
            const bool f32 = dtype == DType::f32;
            const std::size_t element = f32 ? 4 : 2;
            // Device buffers; 16-bit parameters and gradients live in byte arrays.
            DeviceArray<unsigned char> dparam((count + 4) * element), dgrad((count + 4) * element);
            DeviceArray<float> dmaster(count + 4), d0(count + 4), d1(count + 4), d2(count + 4);
            std::vector<float> master = random_values(gen, count, -1.f, 1.f);
            std::vector<float> s0 = random_values(gen, count, -0.1f, 0.1f);
            std::vector<float> s1 = random_values(gen, count, 0.f, 0.01f);
            std::vector<float> s2 = random_values(gen, count, 0.f, 0.02f);
            std::vector<uint16_t> param16 = f32 ? std::vector<uint16_t>{} : narrowed(master, dtype);
            d0.upload(s0, static_cast<std::size_t>(off[3]));
            d1.upload(s1, static_cast<std::size_t>(off[4]));
            d2.upload(s2, static_cast<std::size_t>(off[5]));
            if (f32) {
              REQUIRE(cudaMemcpy(dparam.data() + off[0] * 4, master.data(), count * 4, cudaMemcpyHostToDevice) == cudaSuccess);
            } else {
              dmaster.upload(master, static_cast<std::size_t>(off[2]));
            }
            void* param_ptr = dparam.data() + off[0] * element;
            const void* grad_ptr = dgrad.data() + off[1] * element;
            float* master_ptr = f32 ? nullptr : dmaster.data() + off[2];

            for (int64_t step = 1; step <= 2; ++step) {
              CAPTURE(step);
              const RuleCase rule = rule_cases(step)[static_cast<std::size_t>(rule_index)];
              const std::vector<float> g32 = random_values(gen, count, -2.f, 2.f);
              const std::vector<uint16_t> g16 = f32 ? std::vector<uint16_t>{} : narrowed(g32, dtype);
              const void* grad_host = f32 ? static_cast<const void*>(g32.data()) : g16.data();
              if (count > 0) {
                REQUIRE(cudaMemcpy(const_cast<void*>(grad_ptr), grad_host, count * element, cudaMemcpyHostToDevice) == cudaSuccess);
              }
              const GradTransform gt = step == 2 ? GradTransform{0.5f, 0.8f} : GradTransform{};
              const Rounding r{stochastic, 77, static_cast<uint64_t>(step), 12345};
              const UpdateTensors dt{param_ptr, grad_ptr, master_ptr, dtype};
              std::vector<float>& cpu_value = master;  // the f32 parameter, or the master
              const UpdateTensors ct = f32 ? UpdateTensors{cpu_value.data(), g32.data(), nullptr, dtype}
                                           : UpdateTensors{param16.data(), g16.data(), master.data(), dtype};
              if (rule.adam) {
                float* vmax = rule.adam_scalars.amsgrad ? d2.data() + off[5] : nullptr;
                adam_update_cuda(dt, d0.data() + off[3], d1.data() + off[4], vmax, n, rule.adam_scalars, gt, r,
                                 stream.opaque());
                adam_update_cpu(ct, s0.data(), s1.data(), s2.data(), n, rule.adam_scalars, gt, r, 0);
              } else {
                float* buf = rule.sgd_scalars.use_momentum ? d0.data() + off[3] : nullptr;
                sgd_update_cuda(dt, buf, n, rule.sgd_scalars, gt, r, stream.opaque());
                sgd_update_cpu(ct, s0.data(), n, rule.sgd_scalars, gt, r, 0);
              }
              stream.sync();
              if (f32) {
                std::vector<float> got(count);
                if (count > 0) {
                  REQUIRE(cudaMemcpy(got.data(), param_ptr, count * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
                }
                REQUIRE(same_bits(got, master));
              } else {
                std::vector<uint16_t> got(count);
                if (count > 0) {
                  REQUIRE(cudaMemcpy(got.data(), param_ptr, count * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
                }
                REQUIRE(same_bits(got, param16));
                REQUIRE(same_bits(dmaster.download(static_cast<std::size_t>(off[2]), count), master));
              }
              if (rule.adam || rule.sgd_scalars.use_momentum) {
                REQUIRE(same_bits(d0.download(static_cast<std::size_t>(off[3]), count), s0));
              }
              if (rule.adam) REQUIRE(same_bits(d1.download(static_cast<std::size_t>(off[4]), count), s1));
              if (rule.adam && rule.adam_scalars.amsgrad) {
                REQUIRE(same_bits(d2.download(static_cast<std::size_t>(off[5]), count), s2));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("grad_stats_cuda equals grad_stats_cpu bitwise; accumulation and workspace", "[gpu][stats]") {
  TestStream stream;
  std::mt19937 gen(12);
  DeviceArray<double> out(2);
  DeviceArray<unsigned char> workspace(reduction_workspace_bytes());
  const int64_t sizes[] = {0, 1, 33, 4096, 4097, 100003, 1024 * 4096 + 77, 3 * 1024 * 4096 + 1};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : sizes) {
      for (bool inf_norm : {false, true}) {
        for (int bad : {-1, 0, 1}) {  // none, a NaN at the front, an inf at the back
          CAPTURE(shardopt::dtype_name(dtype), n, inf_norm, bad);
          const std::size_t count = static_cast<std::size_t>(n);
          const std::size_t element = dtype == DType::f32 ? 4 : 2;
          std::vector<float> f = random_values(gen, count, -3.f, 3.f);
          if (count > 0 && bad == 0) f[0] = std::numeric_limits<float>::quiet_NaN();
          if (count > 0 && bad == 1) f[count - 1] = std::numeric_limits<float>::infinity();
          const std::vector<uint16_t> h = dtype == DType::f32 ? std::vector<uint16_t>{} : narrowed(f, dtype);
          const void* host = dtype == DType::f32 ? static_cast<const void*>(f.data()) : h.data();
          DeviceArray<unsigned char> dx(count * element + 8);
          if (count > 0) {
            REQUIRE(cudaMemcpy(dx.data() + element, host, count * element, cudaMemcpyHostToDevice) == cudaSuccess);
          }
          const void* x = dx.data() + element;  // not 16-byte aligned on purpose
          const float unscale = 0.25f;
          const GradStats cpu = grad_stats_cpu(host, dtype, n, unscale, inf_norm, 0);

          grad_stats_cuda(x, dtype, n, unscale, inf_norm, out.data(), false, nullptr, stream.opaque());
          stream.sync();
          std::vector<double> got = out.download(0, 2);
          // Bitwise, except that any NaN equals any NaN: IEEE 754 leaves an arithmetic NaN's
          // sign and payload open, and the device's differ from the host's.
          if (std::isnan(cpu.value)) {
            REQUIRE(std::isnan(got[0]));
          } else {
            REQUIRE(std::memcmp(&got[0], &cpu.value, sizeof(double)) == 0);
          }
          REQUIRE(got[1] == (cpu.nonfinite ? 1.0 : 0.0));

          // The caller's workspace, accumulating onto {1.5, 0}.
          out.upload({1.5, 0.0});
          grad_stats_cuda(x, dtype, n, unscale, inf_norm, out.data(), true, workspace.data(), stream.opaque());
          stream.sync();
          got = out.download(0, 2);
          const double expected = inf_norm ? (cpu.value > 1.5 ? cpu.value : 1.5) : 1.5 + cpu.value;
          if (std::isnan(expected)) {
            REQUIRE(std::isnan(got[0]));
          } else {
            REQUIRE(got[0] == expected);
          }
          REQUIRE(got[1] == (cpu.nonfinite ? 1.0 : 0.0));
        }
      }
    }
  }
}

TEST_CASE("widen_cuda, narrow_cuda and divide_cuda equal the CPU conversions bitwise", "[gpu][convert]") {
  TestStream stream;
  std::mt19937 gen(3);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : kSizes) {
      for (int a : {0, 1, 2}) {
        for (int b : {0, 3}) {
          CAPTURE(shardopt::dtype_name(dtype), n, a, b);
          const std::size_t count = static_cast<std::size_t>(n);
          const std::size_t element = dtype == DType::f32 ? 4 : 2;
          const std::vector<float> f = random_values(gen, count, -70000.f, 70000.f);
          DeviceArray<float> wide(count + 4);
          DeviceArray<unsigned char> narrow((count + 4) * element);
          void* dnarrow = narrow.data() + b * element;
          wide.upload(f, static_cast<std::size_t>(a));

          std::vector<unsigned char> expected(count * element), got(count * element);
          narrow_cpu(f.data(), expected.data(), dtype, n, 0);
          narrow_cuda(wide.data() + a, dnarrow, dtype, n, stream.opaque());
          stream.sync();
          if (count > 0) REQUIRE(cudaMemcpy(got.data(), dnarrow, count * element, cudaMemcpyDeviceToHost) == cudaSuccess);
          REQUIRE(got == expected);

          std::vector<float> widened(count);
          widen_cpu(expected.data(), dtype, widened.data(), n, 0);
          widen_cuda(dnarrow, dtype, wide.data() + a, n, stream.opaque());
          stream.sync();
          REQUIRE(same_bits(wide.download(static_cast<std::size_t>(a), count), widened));

          divide_cpu(expected.data(), dtype, n, 3.f, 0);
          divide_cuda(dnarrow, dtype, n, 3.f, stream.opaque());
          stream.sync();
          if (count > 0) REQUIRE(cudaMemcpy(got.data(), dnarrow, count * element, cudaMemcpyDeviceToHost) == cudaSuccess);
          REQUIRE(got == expected);
        }
      }
    }
  }
}
