// tests/gpu/test_cuda_compact_kernels.cpp — the CUDA 8-bit blockwise Adam/AdamW (q8 moments) and bf16 master-remainder updates against kernels/cpu over several steps, bitwise: codes, absmax, parameters, masters and remainders.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "cuda/update_cuda.hpp"
#include "gpu_test_support.hpp"

namespace {

using namespace shardopt::kernels;
using shardopt::DType;
using shardopt_test::DeviceArray;
using shardopt_test::TestStream;

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<float> random_values(std::mt19937& gen, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(gen);
  return values;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  narrow_cpu(x.data(), out.data(), DType::bf16, static_cast<int64_t>(x.size()), 1);
  return out;
}

// How the master of a parameter is kept.
enum class Master { none, fp32, remainder };

const char* master_name(Master m) { return m == Master::none ? "none (f32)" : m == Master::fp32 ? "fp32" : "remainder16"; }

// Host and device copies of one parameter's tensors; `param`/`grad` as raw 32-bit or 16-bit words.
struct Side {
  std::vector<uint32_t> param32, grad32;
  std::vector<uint16_t> param16, grad16;
  std::vector<float> master;
  std::vector<int16_t> remainder;
};

Side make_side(std::mt19937& gen, int64_t n, DType dtype, Master master) {
  Side s;
  const auto un = static_cast<std::size_t>(n);
  const std::vector<float> p = random_values(gen, un, -1.f, 1.f);
  if (dtype == DType::f32) {
    s.param32.resize(un);
    std::memcpy(s.param32.data(), p.data(), un * 4);
  } else {
    s.param16 = to_bf16(p);
    if (master == Master::fp32) s.master = p;
    if (master == Master::remainder) s.remainder.assign(un, 0);  // the master is the bf16 value exactly
  }
  return s;
}

void new_gradients(std::mt19937& gen, Side& s, int64_t n, DType dtype, int step) {
  std::vector<float> g = random_values(gen, static_cast<std::size_t>(n), -1e-2f, 1e-2f);
  // Edges: the first block's gradients all zero at odd steps (its moments decay), one element
  // large. No NaN: the device writes its canonical NaN where the CPU propagates an operand's.
  if (step % 2 == 1) {
    for (int64_t i = 0; i < std::min<int64_t>(n, 256); ++i) g[static_cast<std::size_t>(i)] = 0.f;
  }
  if (n > 300) g[300] = 5.f;
  if (dtype == DType::f32) {
    s.grad32.resize(g.size());
    std::memcpy(s.grad32.data(), g.data(), g.size() * 4);
  } else {
    s.grad16 = to_bf16(g);
  }
}

UpdateTensors host_tensors(Side& s, DType dtype) {
  UpdateTensors t;
  t.dtype = dtype;
  t.param = dtype == DType::f32 ? static_cast<void*>(s.param32.data()) : static_cast<void*>(s.param16.data());
  t.grad = dtype == DType::f32 ? static_cast<const void*>(s.grad32.data()) : static_cast<const void*>(s.grad16.data());
  t.master = s.master.empty() ? nullptr : s.master.data();
  t.master_remainder = s.remainder.empty() ? nullptr : s.remainder.data();
  return t;
}

// The device copy of a Side: uploaded before each step (gradients) and compared after.
struct DeviceSide {
  DeviceArray<uint32_t> param32, grad32;
  DeviceArray<uint16_t> param16, grad16;
  DeviceArray<float> master;
  DeviceArray<int16_t> remainder;
  explicit DeviceSide(std::size_t n) : param32(n), grad32(n), param16(n), grad16(n), master(n), remainder(n) {}

  UpdateTensors tensors(const Side& s, DType dtype) {
    UpdateTensors t;
    t.dtype = dtype;
    t.param = dtype == DType::f32 ? static_cast<void*>(param32.data()) : static_cast<void*>(param16.data());
    t.grad = dtype == DType::f32 ? static_cast<const void*>(grad32.data()) : static_cast<const void*>(grad16.data());
    t.master = s.master.empty() ? nullptr : master.data();
    t.master_remainder = s.remainder.empty() ? nullptr : remainder.data();
    return t;
  }
  void upload_all(const Side& s, DType dtype) {
    if (dtype == DType::f32) param32.upload(s.param32);
    else param16.upload(s.param16);
    if (!s.master.empty()) master.upload(s.master);
    if (!s.remainder.empty()) remainder.upload(s.remainder);
  }
  void upload_grad(const Side& s, DType dtype) {
    if (dtype == DType::f32) grad32.upload(s.grad32);
    else grad16.upload(s.grad16);
  }
  // Whether the device's parameter, master and remainders are the host's, bit for bit.
  bool matches(const Side& s, DType dtype, std::size_t n) {
    bool same = dtype == DType::f32 ? same_bits(param32.download(0, n), s.param32) : same_bits(param16.download(0, n), s.param16);
    if (!s.master.empty()) same = same && same_bits(master.download(0, n), s.master);
    if (!s.remainder.empty()) same = same && same_bits(remainder.download(0, n), s.remainder);
    return same;
  }
};

struct Layout {
  DType dtype;
  Master master;
  bool stochastic;
};

const Layout kLayouts[] = {{DType::f32, Master::none, false},
                           {DType::bf16, Master::fp32, false},
                           {DType::bf16, Master::fp32, true},
                           {DType::bf16, Master::remainder, false}};

}  // namespace

TEST_CASE("CUDA q8 Adam/AdamW: codes, absmax and parameters bitwise the CPU kernel's over 6 steps", "[cuda][q8]") {
  TestStream stream;
  const int64_t sizes[] = {1, 77, 256, 4 * 256 + 77, (1 << 18) + 13};
  for (const int64_t n : sizes) {
    for (const Layout& layout : kLayouts) {
      for (const bool decoupled : {false, true}) {
        for (const bool transform : {false, true}) {
          CAPTURE(n, shardopt::dtype_name(layout.dtype), master_name(layout.master), layout.stochastic, decoupled, transform);
          std::mt19937 gen(static_cast<uint32_t>(n) * 31u + (decoupled ? 7u : 0u));
          const auto un = static_cast<std::size_t>(n);
          const auto blocks = static_cast<std::size_t>(q8_blocks(n));
          Side host = make_side(gen, n, layout.dtype, layout.master);
          DeviceSide device(un);
          device.upload_all(host, layout.dtype);
          std::vector<uint8_t> c1(un, 0), c2(un, 0);
          std::vector<float> a1(blocks, 0.f), a2(blocks, 0.f);
          DeviceArray<uint8_t> dc1(un), dc2(un);
          DeviceArray<float> da1(blocks), da2(blocks);
          dc1.upload(c1);
          dc2.upload(c2);
          da1.upload(a1);
          da2.upload(a2);
          GradTransform gt;
          if (transform) {
            gt.unscale = 1.f / 1024.f;
            gt.clip = 0.75f;
          }
          Rounding r;
          r.stochastic = layout.stochastic;
          r.seed = 99;
          r.first_index = 12345;
          for (int step = 1; step <= 6; ++step) {
            CAPTURE(step);
            new_gradients(gen, host, n, layout.dtype, step);
            device.upload_grad(host, layout.dtype);
            r.step = static_cast<uint64_t>(step);
            const AdamScalars s = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled, false, false, step);
            adam_update_q8_cpu(host_tensors(host, layout.dtype), Q8Moments{c1.data(), c2.data(), a1.data(), a2.data()}, n,
                               s, gt, r, 2);
            adam_update_q8_cuda(device.tensors(host, layout.dtype),
                                Q8Moments{dc1.data(), dc2.data(), da1.data(), da2.data()}, n, s, gt, r, stream.opaque());
            stream.sync();
            REQUIRE(same_bits(dc1.download(0, un), c1));
            REQUIRE(same_bits(dc2.download(0, un), c2));
            REQUIRE(same_bits(da1.download(0, blocks), a1));
            REQUIRE(same_bits(da2.download(0, blocks), a2));
            REQUIRE(device.matches(host, layout.dtype, un));
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA master remainders: SGD and Adam with fp32 state bitwise the CPU loops over 6 steps", "[cuda][remainder]") {
  TestStream stream;
  const int64_t sizes[] = {1, 5, 1037, (1 << 18) + 3};
  for (const int64_t n : sizes) {
    for (const bool adam : {false, true}) {
      for (const bool transform : {false, true}) {
        CAPTURE(n, adam, transform);
        std::mt19937 gen(static_cast<uint32_t>(n) + (adam ? 1000u : 0u));
        const auto un = static_cast<std::size_t>(n);
        Side host = make_side(gen, n, DType::bf16, Master::remainder);
        DeviceSide device(un);
        device.upload_all(host, DType::bf16);
        std::vector<float> m(un, 0.f), v(un, 0.f), vmax(un, 0.f);
        DeviceArray<float> dm(un), dv(un), dvmax(un);
        dm.upload(m);
        dv.upload(v);
        dvmax.upload(vmax);
        GradTransform gt;
        if (transform) gt.unscale = 0.5f;
        for (int step = 1; step <= 6; ++step) {
          CAPTURE(step);
          new_gradients(gen, host, n, DType::bf16, step);
          device.upload_grad(host, DType::bf16);
          Rounding r;
          r.step = static_cast<uint64_t>(step);
          if (adam) {
            const AdamScalars s = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, step % 2 == 0, true, false, step);
            adam_update_cpu(host_tensors(host, DType::bf16), m.data(), v.data(), vmax.data(), n, s, gt, r, 2);
            adam_update_cuda(device.tensors(host, DType::bf16), dm.data(), dv.data(), dvmax.data(), n, s, gt, r,
                             stream.opaque());
          } else {
            const SgdScalars s = make_sgd_scalars(1e-2, 0.9, 0.0, 1e-4, true, false, step == 1);
            sgd_update_cpu(host_tensors(host, DType::bf16), m.data(), n, s, gt, r, 2);
            sgd_update_cuda(device.tensors(host, DType::bf16), dm.data(), n, s, gt, r, stream.opaque());
          }
          stream.sync();
          REQUIRE(device.matches(host, DType::bf16, un));
          REQUIRE(same_bits(dm.download(0, un), m));
          if (adam) {
            REQUIRE(same_bits(dv.download(0, un), v));
            REQUIRE(same_bits(dvmax.download(0, un), vmax));
          }
        }
      }
    }
  }
}
