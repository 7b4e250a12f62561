// tests/unit/test_mixed_items_host.cpp — the CUDA update and conversion item ops (f32, bf16, f16) and mixed-size launch plans run on the host, bitwise against kernels/cpu.
//
// No GPU needed: kernels/cuda/mixed_items.hpp and launch_plan.hpp are plain C++ that the CUDA
// kernels run per thread. Every thread of a grid is emulated in turn here, which checks that
// each element is visited once, that vector items are aligned for every stream (16 bytes for
// floats, 8 for 16-bit elements), and that the results equal the CPU loops bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "cuda/launch_plan.hpp"
#include "cuda/mixed_items.hpp"
#include "mixed_update.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

// Elements whose element 0 sits `offset` elements past a 64-byte boundary.
template <typename T>
class Aligned {
 public:
  Aligned(std::size_t n, int offset) : storage_(n + 64 / sizeof(T) + 16) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    base_ = storage_.data() + ((64 - address % 64) % 64) / sizeof(T) + offset;
    n_ = n;
  }
  T* data() { return base_; }
  std::vector<T> values() const { return std::vector<T>(base_, base_ + n_); }
  void set(const std::vector<T>& v) { std::copy(v.begin(), v.end(), base_); }

 private:
  std::vector<T> storage_;
  T* base_ = nullptr;
  std::size_t n_ = 0;
};

template <typename Op>
void emulate_launch(const VectorPlan& plan, const GridShape& grid, const Op& op) {
  const int64_t step = grid_stride_step(grid.blocks, grid.threads);
  for (int64_t block = 0; block < grid.blocks; ++block) {
    for (int64_t thread = 0; thread < grid.threads; ++thread) {
      run_plan_items(plan, grid_stride_first(block, grid.threads, thread), step, op);
    }
  }
}

std::vector<float> random_floats(std::mt19937& gen, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
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

struct Grid {
  int threads;
  int64_t max_blocks;
};
const Grid kGrids[] = {{1, 1}, {3, 2}, {32, 5}, {256, 1000}};

// Element offsets of (param, grad, master, state...) from a 64-byte boundary: in step (vector
// body after a head), a 16-bit stream out of step (all scalar), a float stream out of step.
const int kOffsets[][6] = {{0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {3, 3, 3, 3, 3, 3},
                           {2, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 2},
                           {5, 5, 1, 1, 1, 1}};  // 5 and 1 share the phase mod 4

}  // namespace

TEST_CASE("mixed-size plans keep every stream's vector accesses aligned and visit each element once", "[cuda][plan][mixed]") {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{9}, int64_t{1037}}) {
    for (const auto& off : kOffsets) {
      CAPTURE(n, off[0], off[1], off[2]);
      Aligned<uint16_t> param(static_cast<std::size_t>(n), off[0]), grad(static_cast<std::size_t>(n), off[1]);
      Aligned<float> master(static_cast<std::size_t>(n), off[2]), state(static_cast<std::size_t>(n), off[3]);
      const std::uintptr_t addresses[] = {reinterpret_cast<std::uintptr_t>(param.data()),
                                          reinterpret_cast<std::uintptr_t>(grad.data()),
                                          reinterpret_cast<std::uintptr_t>(master.data()),
                                          reinterpret_cast<std::uintptr_t>(state.data())};
      const int sizes[] = {2, 2, 4, 4};
      const VectorPlan plan = make_vector_plan(n, addresses, sizes, 4);
      const bool in_step = off[0] % 4 == off[1] % 4 && off[1] % 4 == off[2] % 4 && off[2] % 4 == off[3] % 4;
      if (n >= 8 && in_step) REQUIRE(plan.vectors > 0);
      if (!in_step) REQUIRE(plan.vectors == 0);
      std::vector<int> visits(static_cast<std::size_t>(n), 0);
      for (int64_t i = 0; i < plan.items(); ++i) {
        const PlanItem item = plan_item(plan, i);
        if (item.width == kVectorWidth) {
          for (int s = 0; s < 4; ++s) {
            REQUIRE((addresses[s] + static_cast<std::uintptr_t>(item.first * sizes[s])) %
                        static_cast<std::uintptr_t>(kVectorWidth * sizes[s]) == 0);
          }
        }
        for (int l = 0; l < item.width; ++l) ++visits[static_cast<std::size_t>(item.first + l)];
      }
      for (int v : visits) REQUIRE(v == 1);
    }
  }
}

TEST_CASE("mixed Adam/SGD item ops through the launch plan equal the CPU loops bitwise", "[cuda][plan][mixed]") {
  std::mt19937 gen(77);
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, false, 4);
  const AdamScalars adam_l2 = make_adam_scalars(1e-2, 0.8, 0.99, 1e-6, 0.1, false, false, true, 2);
  const SgdScalars sgd = make_sgd_scalars(0.05, 0.9, 0.1, 0.01, true, false, false);
  const SgdScalars plain = make_sgd_scalars(0.05, 0.0, 0.0, 0.0, false, false, true);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool stochastic : {false, true}) {
      for (int rule = 0; rule < 4; ++rule) {
        for (int64_t n : {int64_t{1}, int64_t{6}, int64_t{1037}}) {
          for (const auto& off : kOffsets) {
            for (const Grid& g : kGrids) {
              CAPTURE(shardopt::dtype_name(dtype), stochastic, rule, n, off[0], off[1], off[2], g.threads, g.max_blocks);
              const std::size_t count = static_cast<std::size_t>(n);
              const bool f32 = dtype == DType::f32;
              // With and without a gradient transform, for every dtype (f32 without one is the
              // plain f32 update, which the CUDA kernels also run through these ops).
              const GradTransform gt = rule % 2 == 1 ? GradTransform{0.5f, 0.75f} : GradTransform{};
              const Rounding r{stochastic, 31, 8, 4096};
              const std::vector<float> master0 = random_floats(gen, count, -1, 1);
              const std::vector<float> grad32 = random_floats(gen, count, -1, 1);
              const std::vector<float> s0 = random_floats(gen, count, -0.1f, 0.1f);
              const std::vector<float> s1 = random_floats(gen, count, 0, 0.01f);
              const std::vector<float> s2 = random_floats(gen, count, 0, 0.02f);
              const std::vector<uint16_t> grad16 = f32 ? std::vector<uint16_t>{} : narrowed(grad32, dtype);

              // CPU reference.
              std::vector<float> cm = master0, c0 = s0, c1 = s1, c2 = s2;
              std::vector<uint16_t> cp(count);
              const UpdateTensors ct = f32 ? UpdateTensors{cm.data(), grad32.data(), nullptr, dtype}
                                           : UpdateTensors{cp.data(), grad16.data(), cm.data(), dtype};
              // Emulated device buffers at the chosen offsets.
              Aligned<float> dp32(count, off[0]), dg32(count, off[1]), dm(count, off[2]);
              Aligned<uint16_t> dp16(count, off[0]), dg16(count, off[1]);
              Aligned<float> d0(count, off[3]), d1(count, off[4]), d2(count, off[5]);
              d0.set(s0);
              d1.set(s1);
              d2.set(s2);
              MixedCommon common;
              if (f32) {
                dp32.set(master0);
                dg32.set(grad32);
                common.param = dp32.data();
                common.grad = dg32.data();
              } else {
                dm.set(master0);
                dg16.set(grad16);
                common.param = dp16.data();
                common.grad = dg16.data();
                common.master = dm.data();
              }
              common.gt = gt;
              common.transform = !is_identity(gt);
              common.step_key = rounding_step_key(r.seed, r.step);
              common.first_index = r.first_index;

              const bool is_adam = rule < 2;
              const float* states[3] = {rule == 3 ? nullptr : d0.data(), is_adam ? d1.data() : nullptr,
                                        is_adam && rule == 0 ? d2.data() : nullptr};
              std::uintptr_t addresses[kMaxMixedStreams];
              int sizes[kMaxMixedStreams];
              const int streams = mixed_plan_streams(common, dtype, states, 3, addresses, sizes);
              const VectorPlan plan = make_vector_plan(n, addresses, sizes, streams);
              const GridShape grid = make_grid_shape(plan.items(), g.threads, g.max_blocks);

              const auto run_device = [&](auto format, auto stoch) {
                using Format = decltype(format);
                const MixedLanes<Format, decltype(stoch)::value> lanes{common};
                if (rule == 0) {
                  emulate_launch(plan, grid, MixedAdamItemOp<Format, decltype(stoch)::value, true>{lanes, d0.data(), d1.data(), d2.data(), AdamRule{adam}});
                } else if (rule == 1) {
                  emulate_launch(plan, grid, MixedAdamItemOp<Format, decltype(stoch)::value, false>{lanes, d0.data(), d1.data(), nullptr, AdamRule{adam_l2}});
                } else if (rule == 2) {
                  emulate_launch(plan, grid, MixedSgdItemOp<Format, decltype(stoch)::value, true>{lanes, d0.data(), SgdRule{sgd}});
                } else {
                  emulate_launch(plan, grid, MixedSgdItemOp<Format, decltype(stoch)::value, false>{lanes, nullptr, SgdRule{plain}});
                }
              };
              if (f32) run_device(F32Format{}, std::false_type{});
              else if (dtype == DType::bf16 && stochastic) run_device(Bf16Format{}, std::true_type{});
              else if (dtype == DType::bf16) run_device(Bf16Format{}, std::false_type{});
              else if (stochastic) run_device(F16Format{}, std::true_type{});
              else run_device(F16Format{}, std::false_type{});

              if (rule == 0) adam_update_cpu(ct, c0.data(), c1.data(), c2.data(), n, adam, gt, r, 1);
              else if (rule == 1) adam_update_cpu(ct, c0.data(), c1.data(), nullptr, n, adam_l2, gt, r, 1);
              else if (rule == 2) sgd_update_cpu(ct, c0.data(), n, sgd, gt, r, 1);
              else sgd_update_cpu(ct, nullptr, n, plain, gt, r, 1);

              if (f32) {
                REQUIRE(same_bits(dp32.values(), cm));
              } else {
                REQUIRE(same_bits(dm.values(), cm));
                REQUIRE(same_bits(dp16.values(), cp));
              }
              if (rule != 3) REQUIRE(same_bits(d0.values(), c0));
              if (rule < 2) REQUIRE(same_bits(d1.values(), c1));
              if (rule == 0) REQUIRE(same_bits(d2.values(), c2));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("widen/narrow/divide item ops through the launch plan equal the CPU loops bitwise", "[cuda][plan][mixed]") {
  std::mt19937 gen(5);
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1037}}) {
      for (int a : {0, 1, 3}) {
        for (int b : {0, 2}) {
          CAPTURE(shardopt::dtype_name(dtype), n, a, b);
          const std::size_t count = static_cast<std::size_t>(n);
          const std::vector<float> f = random_floats(gen, count, -300, 300);
          const std::vector<uint16_t> h = narrowed(f, dtype);
          Aligned<float> wide(count, a);
          Aligned<uint16_t> half(count, b);
          const GridShape grid = make_grid_shape(n, 32, 3);
          const auto plan2 = [&](const void* x, int xs, const void* y, int ys) {
            const std::uintptr_t addresses[] = {reinterpret_cast<std::uintptr_t>(x), reinterpret_cast<std::uintptr_t>(y)};
            const int sizes[] = {xs, ys};
            return make_vector_plan(n, addresses, sizes, 2);
          };
          std::vector<uint16_t> expected_h(count);
          std::vector<float> expected_f(count);
          const auto run = [&](auto format) {
            using Format = decltype(format);
            // narrow
            wide.set(f);
            emulate_launch(plan2(wide.data(), 4, half.data(), 2), grid, NarrowItemOp<Format>{wide.data(), half.data()});
            narrow_cpu(f.data(), expected_h.data(), dtype, n, 1);
            REQUIRE(same_bits(half.values(), expected_h));
            // widen
            half.set(h);
            emulate_launch(plan2(half.data(), 2, wide.data(), 4), grid, WidenItemOp<Format>{half.data(), wide.data()});
            widen_cpu(h.data(), dtype, expected_f.data(), n, 1);
            REQUIRE(same_bits(wide.values(), expected_f));
            // divide
            half.set(h);
            emulate_launch(plan2(half.data(), 2, half.data(), 2), grid, DivideItemOp<Format>{half.data(), 3.f});
            expected_h = h;
            divide_cpu(expected_h.data(), dtype, n, 3.f, 1);
            REQUIRE(same_bits(half.values(), expected_h));
          };
          if (dtype == DType::bf16) run(Bf16Format{});
          else run(F16Format{});
        }
      }
    }
  }
}

TEST_CASE("the f32 divide item op (divide_cuda's f32 path) equals divide_cpu bitwise", "[cuda][plan][mixed]") {
  std::mt19937 gen(13);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1037}}) {
    for (int offset : {0, 1, 3}) {
      CAPTURE(n, offset);
      const std::size_t count = static_cast<std::size_t>(n);
      const std::vector<float> x = random_floats(gen, count, -300, 300);
      Aligned<float> device(count, offset);
      device.set(x);
      const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(device.data());
      const int size = 4;
      const VectorPlan plan = make_vector_plan(n, &address, &size, 1);
      if (n >= 8) REQUIRE(plan.vectors > 0);
      emulate_launch(plan, make_grid_shape(plan.items(), 32, 3), DivideItemOp<F32Format>{device.data(), 3.f});
      std::vector<float> expected = x;
      divide_cpu(expected.data(), DType::f32, n, 3.f, 1);
      REQUIRE(same_bits(device.values(), expected));
      // And that is the IEEE quotient, element by element.
      for (std::size_t i = 0; i < count; ++i) REQUIRE(expected[i] == x[i] / 3.f);
      REQUIRE_FALSE(same_bits(device.values(), x));
    }
  }
}
