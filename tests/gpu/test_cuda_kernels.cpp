// tests/gpu/test_cuda_kernels.cpp — the f32 CUDA updates (no gradient transform, the optimizer's plain f32 step) against kernels/cpu, bitwise.
//
// Bitwise parity holds because the update kernels are built with --fmad=false and the CPU
// path with -ffp-contract=off, and sqrtf and '/' are IEEE-rounded on both (see
// kernels/cuda/mixed_kernels.cu). tests/gpu/test_cuda_mixed_kernels.cpp covers bf16/f16 and
// gradient transforms.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
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

// The f32 parameter and gradient as the optimizer passes them: no master.
UpdateTensors f32_tensors(float* param, const float* grad) { return UpdateTensors{param, grad, nullptr, DType::f32}; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Sizes: empty, shorter than one vector, around vector and block edges, and a large odd one.
const int64_t kSizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 31, 33, 255, 256, 257, 1023, 4097, (1 << 20) + 5};

// Element offsets of (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq) in their allocations
// (cudaMalloc is 256-byte aligned): equal offsets use the float4 body after a 0..3 head;
// unequal ones run all-scalar.
const int kOffsets[][5] = {{0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}, {3, 3, 3, 3, 3},
                           {1, 0, 0, 0, 0}, {0, 0, 0, 0, 2}, {3, 2, 1, 0, 3}};

struct AdamCase {
  double weight_decay;
  bool decoupled;
  bool amsgrad;
  bool maximize;
};
const AdamCase kAdamCases[] = {
    {0.0, false, false, false}, {0.1, false, false, false}, {0.1, true, false, false},
    {0.0, false, true, false},  {0.05, true, true, true},
};

}  // namespace

TEST_CASE("adam_update_cuda equals adam_update_cpu bitwise", "[gpu][adam]") {
  TestStream stream;
  std::mt19937 gen(2024);
  for (int64_t n : kSizes) {
    for (const auto& offsets : kOffsets) {
      for (const AdamCase& c : kAdamCases) {
        CAPTURE(n, offsets[0], offsets[1], offsets[2], offsets[3], offsets[4], c.weight_decay,
                c.decoupled, c.amsgrad, c.maximize);
        const std::size_t count = static_cast<std::size_t>(n);
        DeviceArray<float> dp(count + 4), dg(count + 4), dm(count + 4), dv(count + 4),
            dvmax(count + 4);
        std::vector<float> p = random_values(gen, count, -1.f, 1.f);
        std::vector<float> m = random_values(gen, count, -0.1f, 0.1f);
        std::vector<float> v = random_values(gen, count, 0.f, 0.01f);
        std::vector<float> vmax = random_values(gen, count, 0.f, 0.02f);
        const std::vector<float> p0 = p;
        dp.upload(p, offsets[0]);
        dm.upload(m, offsets[2]);
        dv.upload(v, offsets[3]);
        dvmax.upload(vmax, offsets[4]);
        for (int64_t step = 1; step <= 3; ++step) {
          CAPTURE(step);
          std::vector<float> g = random_values(gen, count, -2.f, 2.f);
          if (count > 2) g[count / 2] = 0.f;
          dg.upload(g, offsets[1]);
          const AdamScalars s = make_adam_scalars(1e-2, 0.9, 0.999, 1e-8, c.weight_decay,
                                                  c.decoupled, c.amsgrad, c.maximize, step);
          adam_update_cuda(f32_tensors(dp.data() + offsets[0], dg.data() + offsets[1]), dm.data() + offsets[2],
                           dv.data() + offsets[3], c.amsgrad ? dvmax.data() + offsets[4] : nullptr,
                           n, s, GradTransform{}, Rounding{}, stream.opaque());
          adam_update_cpu(p.data(), g.data(), m.data(), v.data(), vmax.data(), n, s, 0);
          stream.sync();
          REQUIRE(same_bits(dp.download(offsets[0], count), p));
          REQUIRE(same_bits(dm.download(offsets[2], count), m));
          REQUIRE(same_bits(dv.download(offsets[3], count), v));
          REQUIRE(same_bits(dvmax.download(offsets[4], count), vmax));
        }
        if (n > 0) REQUIRE_FALSE(same_bits(p, p0));
      }
    }
  }
}

TEST_CASE("sgd_update_cuda equals sgd_update_cpu bitwise", "[gpu][sgd]") {
  TestStream stream;
  std::mt19937 gen(77);
  struct SgdCase {
    double momentum, dampening, weight_decay;
    bool nesterov, maximize;
  };
  const SgdCase cases[] = {{0.0, 0.0, 0.0, false, false},
                           {0.0, 0.0, 0.01, false, true},
                           {0.9, 0.1, 0.01, false, false},
                           {0.9, 0.0, 0.01, true, false}};
  for (int64_t n : kSizes) {
    for (const auto& offsets : kOffsets) {
      for (const SgdCase& c : cases) {
        CAPTURE(n, offsets[0], offsets[1], offsets[2], c.momentum, c.dampening, c.weight_decay,
                c.nesterov, c.maximize);
        const std::size_t count = static_cast<std::size_t>(n);
        DeviceArray<float> dp(count + 4), dg(count + 4), db(count + 4);
        std::vector<float> p = random_values(gen, count, -1.f, 1.f);
        std::vector<float> b(count, 0.f);
        dp.upload(p, offsets[0]);
        db.upload(b, offsets[2]);
        for (int step = 1; step <= 3; ++step) {
          CAPTURE(step);
          const std::vector<float> g = random_values(gen, count, -1.f, 1.f);
          dg.upload(g, offsets[1]);
          const SgdScalars s = make_sgd_scalars(0.1, c.momentum, c.dampening, c.weight_decay,
                                                c.nesterov, c.maximize, step == 1);
          sgd_update_cuda(f32_tensors(dp.data() + offsets[0], dg.data() + offsets[1]),
                          s.use_momentum ? db.data() + offsets[2] : nullptr, n, s, GradTransform{},
                          Rounding{}, stream.opaque());
          sgd_update_cpu(p.data(), g.data(), b.data(), n, s, 0);
          stream.sync();
          REQUIRE(same_bits(dp.download(offsets[0], count), p));
          if (s.use_momentum) REQUIRE(same_bits(db.download(offsets[2], count), b));
        }
      }
    }
  }
}

TEST_CASE("shards cut at odd boundaries, one launch each, equal one CPU update of the whole", "[gpu][shard]") {
  TestStream stream;
  std::mt19937 gen(5);
  const int64_t total = 100003;
  const std::size_t count = static_cast<std::size_t>(total);
  const std::vector<int64_t> cut = {0, 1, 7, 25001, 50002, 50003, 75004, total};
  DeviceArray<float> dp(count), dg(count), dm(count), dv(count);
  LaunchCache launch;  // as an optimizer keeps it: launch parameters from the first launch on
  std::vector<float> p = random_values(gen, count, -1.f, 1.f);
  std::vector<float> m(count, 0.f), v(count, 0.f);
  dp.upload(p);
  dm.upload(m);
  dv.upload(v);
  for (int64_t step = 1; step <= 2; ++step) {
    const std::vector<float> g = random_values(gen, count, -1.f, 1.f);
    dg.upload(g);
    const AdamScalars s = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, true, false, false, step);
    for (std::size_t r = 0; r + 1 < cut.size(); ++r) {
      const int64_t b = cut[r];
      adam_update_cuda(f32_tensors(dp.data() + b, dg.data() + b), dm.data() + b, dv.data() + b, nullptr,
                       cut[r + 1] - b, s, GradTransform{}, Rounding{}, stream.opaque(), &launch);
    }
    // One kernel, so the runtime was asked twice in all (its occupancy, the SM count), on the
    // first launch: none of the other 13 asked anything.
    REQUIRE(launch.queries() == 2);
    REQUIRE(launch.sms() > 0);
    adam_update_cpu(p.data(), g.data(), m.data(), v.data(), nullptr, total, s, 0);
    stream.sync();
    REQUIRE(same_bits(dp.download(0, count), p));
    REQUIRE(same_bits(dm.download(0, count), m));
    REQUIRE(same_bits(dv.download(0, count), v));
  }
}
