// tests/gpu/test_cuda_launch_plan_host.cpp — the CUDA launch plan and item ops run on the host: coverage and bitwise parity with kernels/cpu.
//
// No GPU needed: the kernels index through kernels/cuda/launch_plan.hpp and apply the item ops
// of kernels/cuda/mixed_items.hpp, both plain C++. Here every thread of a grid is emulated in
// turn, running the same grid-stride loop, which checks that each element is visited exactly
// once, that vector items are 16-byte aligned for every stream, and that the f32 update (the
// item ops with F32Format and no gradient transform, as sgd_update_cuda / adam_update_cuda run
// it) equals adam_update_cpu / sgd_update_cpu bit for bit whatever the alignment, shard
// boundaries or grid. tests/unit/test_mixed_items_host.cpp covers bf16/f16 and transforms.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "cpu/update_cpu.hpp"
#include "cuda/launch_plan.hpp"
#include "cuda/mixed_items.hpp"

namespace {

using namespace shardopt::kernels;

// Floats whose element 0 sits on a 64-byte boundary, so a test controls each stream's offset.
class AlignedFloats {
 public:
  // Room for the shift to 64 bytes (up to 15 floats) and for offsets up to 16 floats.
  explicit AlignedFloats(std::size_t n) : storage_(n + 32, 0.f) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    base_ = storage_.data() + ((64 - address % 64) % 64) / sizeof(float);
  }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* at(std::size_t offset) { return base_ + offset; }

 private:
  std::vector<float> storage_;
  float* base_ = nullptr;
};

struct GridCase {
  int threads;
  int64_t max_blocks;
};
// One thread; odd block sizes smaller than a warp; capped grids that loop; ample grids.
const GridCase kGrids[] = {{1, 1}, {3, 2}, {7, 3}, {32, 5}, {256, 1000}};

// Runs the kernel's per-thread loop for every (block, thread) of the grid: forward order, or
// backward to show the result does not depend on which thread runs first.
template <typename Op>
void emulate_launch(const VectorPlan& plan, const GridShape& grid, const Op& op,
                    bool backward = false) {
  const int64_t step = grid_stride_step(grid.blocks, grid.threads);
  const int64_t total = grid.blocks * grid.threads;
  for (int64_t k = 0; k < total; ++k) {
    const int64_t global = backward ? total - 1 - k : k;
    const int64_t block = global / grid.threads;
    const int64_t thread = global % grid.threads;
    run_plan_items(plan, grid_stride_first(block, grid.threads, thread), step, op);
  }
}

std::vector<float> random_values(std::mt19937& gen, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(n);
  for (float& v : values) v = dist(gen);
  return values;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return n <= 0 || std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

// Offsets (in floats) of param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq from a 16-byte
// boundary: all equal (vector body after a head of 0..3), then one stream out of step (all
// scalar), then a mixture.
std::vector<std::vector<int>> offset_cases() {
  std::vector<std::vector<int>> cases;
  for (int o = 0; o < 4; ++o) cases.push_back({o, o, o, o, o});
  for (int stream = 0; stream < 5; ++stream) {
    for (int shift = 1; shift < 4; ++shift) {
      std::vector<int> c(5, 0);
      c[static_cast<std::size_t>(stream)] = shift;
      cases.push_back(c);
    }
  }
  cases.push_back({1, 2, 3, 0, 1});
  return cases;
}

// Records, per element, how many times it was visited and by which thread.
struct VisitRecorder {
  const float* const* streams;
  int stream_count;
  std::vector<int>* visits;
  int64_t* current_thread;
  std::vector<int64_t>* visitor;
  int* misaligned_vectors;

  void operator()(const PlanItem& item) const {
    REQUIRE((item.width == 1 || item.width == kVectorWidth));
    if (item.width == kVectorWidth) {
      for (int s = 0; s < stream_count; ++s) {
        const auto address = reinterpret_cast<std::uintptr_t>(streams[s] + item.first);
        if (address % kVectorBytes != 0) ++*misaligned_vectors;
      }
    }
    for (int l = 0; l < item.width; ++l) {
      const auto e = static_cast<std::size_t>(item.first + l);
      REQUIRE(e < visits->size());
      ++(*visits)[e];
      (*visitor)[e] = *current_thread;
    }
  }
};

}  // namespace

TEST_CASE("vector plan splits [0,n) into an aligned head, a float4 body and a short tail", "[cuda][plan]") {
  AlignedFloats a(64), b(64);
  for (int64_t n = 0; n <= 33; ++n) {
    for (int offset = 0; offset < 4; ++offset) {
      CAPTURE(n, offset);
      const std::uintptr_t same[2] = {reinterpret_cast<std::uintptr_t>(a.at(offset)),
                                      reinterpret_cast<std::uintptr_t>(b.at(offset))};
      const VectorPlan plan = make_vector_plan(n, same, 2);
      REQUIRE(plan.n == n);
      REQUIRE(plan.head + kVectorWidth * plan.vectors + plan.tail() == n);
      REQUIRE(plan.items() == plan.head + plan.vectors + plan.tail());
      REQUIRE(plan.head >= 0);
      REQUIRE(plan.head <= 3);
      REQUIRE(plan.tail() >= 0);
      REQUIRE(plan.tail() <= 3);
      // The head is exactly what it takes to reach the 16-byte boundary (or all of a short range).
      const int64_t to_boundary = (4 - offset) % 4;
      REQUIRE(plan.head == std::min<int64_t>(n, to_boundary));
      REQUIRE(plan.vectors == (n - plan.head) / 4);
      if (plan.vectors > 0) {
        REQUIRE((same[0] + static_cast<std::uintptr_t>(plan.head) * 4) % 16 == 0);
      }

      // Streams out of step with each other: scalar items only, still all of [0,n).
      const std::uintptr_t skewed[2] = {reinterpret_cast<std::uintptr_t>(a.at(offset)),
                                        reinterpret_cast<std::uintptr_t>(b.at((offset + 1) % 4))};
      const VectorPlan scalar = make_vector_plan(n, skewed, 2);
      REQUIRE(scalar.vectors == 0);
      REQUIRE(scalar.items() == n);
      REQUIRE_FALSE(scalar.vectorized());
    }
  }
  // Not even 4-byte aligned (a reinterpreted byte buffer): never vectorised.
  const std::uintptr_t odd[1] = {reinterpret_cast<std::uintptr_t>(a.at(0)) + 2};
  REQUIRE(make_vector_plan(100, odd, 1).vectors == 0);
  REQUIRE(make_vector_plan(100, odd, 1).items() == 100);
  // A big aligned range is almost all body.
  const std::uintptr_t aligned[1] = {reinterpret_cast<std::uintptr_t>(a.at(0))};
  const VectorPlan big = make_vector_plan(int64_t{1} << 33, aligned, 1);
  REQUIRE(big.head == 0);
  REQUIRE(big.vectors == (int64_t{1} << 31));
  REQUIRE(big.tail() == 0);
  REQUIRE(make_vector_plan(-5, aligned, 1).items() == 0);
}

TEST_CASE("plan items map to elements in order: head, body, tail", "[cuda][plan]") {
  VectorPlan plan;
  plan.n = 14;
  plan.head = 3;
  plan.vectors = 2;  // elements 3..10, tail 11..13
  REQUIRE(plan.items() == 8);
  const PlanItem expected[] = {{0, 1}, {1, 1}, {2, 1}, {3, 4}, {7, 4}, {11, 1}, {12, 1}, {13, 1}};
  for (int64_t i = 0; i < plan.items(); ++i) {
    CAPTURE(i);
    const PlanItem item = plan_item(plan, i);
    REQUIRE(item.first == expected[i].first);
    REQUIRE(item.width == expected[i].width);
  }
}

TEST_CASE("grid shape covers the items with at most max_blocks blocks", "[cuda][plan]") {
  REQUIRE(make_grid_shape(0, 256, 100).blocks == 0);
  REQUIRE(make_grid_shape(-1, 256, 100).blocks == 0);
  REQUIRE(make_grid_shape(5, 0, 100).blocks == 0);
  REQUIRE(make_grid_shape(1, 256, 100).blocks == 1);
  REQUIRE(make_grid_shape(256, 256, 100).blocks == 1);
  REQUIRE(make_grid_shape(257, 256, 100).blocks == 2);
  REQUIRE(make_grid_shape(int64_t{1} << 40, 256, 1056).blocks == 1056);
  REQUIRE(make_grid_shape(1000, 256, 0).blocks == 1);  // a zero cap still launches
  REQUIRE(make_grid_shape(1000, 256, 2).threads == 256);
  REQUIRE(grid_stride_first(3, 256, 5) == 3 * 256 + 5);
  REQUIRE(grid_stride_step(7, 32) == 224);
}

TEST_CASE("every element is visited exactly once, by the thread the grid-stride loop names", "[cuda][plan]") {
  AlignedFloats buffers[5] = {AlignedFloats(64), AlignedFloats(64), AlignedFloats(64),
                              AlignedFloats(64), AlignedFloats(64)};
  for (int64_t n = 0; n <= 33; ++n) {
    for (const auto& offsets : offset_cases()) {
      for (int count : {1, 2, 5}) {
        const float* streams[5];
        std::uintptr_t addresses[5];
        for (int s = 0; s < count; ++s) {
          streams[s] = buffers[s].at(static_cast<std::size_t>(offsets[static_cast<std::size_t>(s)]));
          addresses[s] = reinterpret_cast<std::uintptr_t>(streams[s]);
        }
        const VectorPlan plan = make_vector_plan(n, addresses, count);
        for (const GridCase& g : kGrids) {
          CAPTURE(n, count, offsets, g.threads, g.max_blocks);
          const GridShape grid = make_grid_shape(plan.items(), g.threads, g.max_blocks);
          std::vector<int> visits(static_cast<std::size_t>(n), 0);
          std::vector<int64_t> visitor(static_cast<std::size_t>(n), -1);
          int64_t current = -1;
          int misaligned = 0;
          const VisitRecorder recorder{streams, count, &visits, &current, &visitor, &misaligned};
          const int64_t step = grid_stride_step(grid.blocks, grid.threads);
          for (int64_t block = 0; block < grid.blocks; ++block) {
            for (int thread = 0; thread < grid.threads; ++thread) {
              current = grid_stride_first(block, grid.threads, thread);
              run_plan_items(plan, current, step, recorder);
            }
          }
          REQUIRE(misaligned == 0);
          for (int64_t e = 0; e < n; ++e) {
            CAPTURE(e);
            REQUIRE(visits[static_cast<std::size_t>(e)] == 1);
          }
          // Item i belongs to thread i mod (blocks*threads): check through each item's first element.
          for (int64_t i = 0; i < plan.items(); ++i) {
            const PlanItem item = plan_item(plan, i);
            REQUIRE(visitor[static_cast<std::size_t>(item.first)] == i % step);
          }
          if (n > 0) REQUIRE(grid.blocks >= 1);
        }
      }
    }
  }
}

namespace {

struct AdamCase {
  double weight_decay;
  bool decoupled;
  bool amsgrad;
  bool maximize;
};
const AdamCase kAdamCases[] = {
    {0.0, false, false, false}, {0.1, false, false, false}, {0.1, true, false, false},
    {0.0, false, true, false},  {0.05, true, true, true},   {0.1, false, true, true},
};

// One Adam state laid out at chosen offsets, for the plan path or the CPU path.
struct AdamState {
  AlignedFloats p, g, m, v, vmax;
  std::vector<int> offsets;
  int64_t n;
  AdamState(int64_t n_, const std::vector<int>& offsets_)
      : p(static_cast<std::size_t>(n_)), g(static_cast<std::size_t>(n_)),
        m(static_cast<std::size_t>(n_)), v(static_cast<std::size_t>(n_)),
        vmax(static_cast<std::size_t>(n_)), offsets(offsets_), n(n_) {}
  float* param() { return p.at(static_cast<std::size_t>(offsets[0])); }
  float* grad() { return g.at(static_cast<std::size_t>(offsets[1])); }
  float* exp_avg() { return m.at(static_cast<std::size_t>(offsets[2])); }
  float* exp_avg_sq() { return v.at(static_cast<std::size_t>(offsets[3])); }
  float* max_exp_avg_sq() { return vmax.at(static_cast<std::size_t>(offsets[4])); }
};

void fill(float* dst, const std::vector<float>& values) {
  if (!values.empty()) std::memcpy(dst, values.data(), values.size() * sizeof(float));
}

// An f32 update as the kernels launch it: the parameter is its own master, no transform.
using F32Lanes = MixedLanes<F32Format, false>;
F32Lanes f32_lanes(float* param, const float* grad) {
  MixedCommon c;
  c.param = param;
  c.grad = grad;
  return F32Lanes{c};
}

// The plan sgd_update_cuda / adam_update_cuda make: param, grad and the state streams in use
// (null ones are left out).
VectorPlan f32_update_plan(const F32Lanes& lanes, int64_t n, const float* const* states, int count) {
  std::uintptr_t addresses[kMaxMixedStreams];
  int sizes[kMaxMixedStreams];
  const int streams = mixed_plan_streams(lanes.c, shardopt::DType::f32, states, count, addresses, sizes);
  return make_vector_plan(n, addresses, sizes, streams);
}

}  // namespace

TEST_CASE("Adam/AdamW through the launch plan equals adam_update_cpu bitwise", "[cuda][plan][adam]") {
  std::mt19937 gen(1234);
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 33; ++n) sizes.push_back(n);
  sizes.push_back(257);
  sizes.push_back(1031);
  const auto offsets_list = offset_cases();
  for (int64_t n : sizes) {
    for (std::size_t oc = 0; oc < offsets_list.size(); ++oc) {
      // Large sizes take a sample of the offset cases to keep the run short.
      if (n > 33 && oc % 4 != 0) continue;
      for (const AdamCase& c : kAdamCases) {
        const std::size_t count = static_cast<std::size_t>(n);
        const auto p0 = random_values(gen, count, -1.f, 1.f);
        const auto m0 = random_values(gen, count, -0.1f, 0.1f);
        const auto v0 = random_values(gen, count, 0.f, 0.01f);
        const auto vmax0 = random_values(gen, count, 0.f, 0.02f);
        const GridCase g = kGrids[(static_cast<std::size_t>(n) + oc) % std::size(kGrids)];
        CAPTURE(n, offsets_list[oc], c.weight_decay, c.decoupled, c.amsgrad, c.maximize,
                g.threads, g.max_blocks);

        AdamState gpu(n, offsets_list[oc]);
        AdamState cpu(n, {0, 0, 0, 0, 0});
        for (AdamState* s : {&gpu, &cpu}) {
          fill(s->param(), p0);
          fill(s->exp_avg(), m0);
          fill(s->exp_avg_sq(), v0);
          fill(s->max_exp_avg_sq(), vmax0);
        }
        for (int64_t step = 1; step <= 3; ++step) {
          auto grad = random_values(gen, count, -2.f, 2.f);
          if (count > 2) grad[count / 2] = 0.f;  // exact zeros exercise the denominators' eps
          fill(gpu.grad(), grad);
          fill(cpu.grad(), grad);
          const AdamScalars s = make_adam_scalars(1e-2, 0.9, 0.999, 1e-8, c.weight_decay,
                                                  c.decoupled, c.amsgrad, c.maximize, step);
          adam_update_cpu(cpu.param(), cpu.grad(), cpu.exp_avg(), cpu.exp_avg_sq(),
                          cpu.max_exp_avg_sq(), n, s, 1);

          const F32Lanes lanes = f32_lanes(gpu.param(), gpu.grad());
          float* vmax = c.amsgrad ? gpu.max_exp_avg_sq() : nullptr;
          const float* states[] = {gpu.exp_avg(), gpu.exp_avg_sq(), vmax};
          const VectorPlan plan = f32_update_plan(lanes, n, states, 3);
          const GridShape grid = make_grid_shape(plan.items(), g.threads, g.max_blocks);
          if (c.amsgrad) {
            emulate_launch(plan, grid,
                           MixedAdamItemOp<F32Format, false, true>{lanes, gpu.exp_avg(), gpu.exp_avg_sq(), vmax,
                                                                   AdamRule{s}},
                           step == 2);
          } else {
            emulate_launch(plan, grid,
                           MixedAdamItemOp<F32Format, false, false>{lanes, gpu.exp_avg(), gpu.exp_avg_sq(), vmax,
                                                                    AdamRule{s}},
                           step == 2);
          }
          CAPTURE(step, plan.head, plan.vectors);
          REQUIRE(same_bits(gpu.param(), cpu.param(), n));
          REQUIRE(same_bits(gpu.exp_avg(), cpu.exp_avg(), n));
          REQUIRE(same_bits(gpu.exp_avg_sq(), cpu.exp_avg_sq(), n));
          REQUIRE(same_bits(gpu.max_exp_avg_sq(), cpu.max_exp_avg_sq(), n));
        }
        // The update did something (a test that cannot fail is a defect).
        if (n > 0) REQUIRE_FALSE(same_bits(gpu.param(), p0.data(), n));
      }
    }
  }
}

namespace {

struct SgdCase {
  double momentum;
  double dampening;
  double weight_decay;
  bool nesterov;
  bool maximize;
};
const SgdCase kSgdCases[] = {
    {0.0, 0.0, 0.0, false, false}, {0.0, 0.0, 0.01, false, true}, {0.9, 0.0, 0.0, false, false},
    {0.9, 0.1, 0.01, false, false}, {0.9, 0.0, 0.01, true, false}, {0.5, 0.0, 0.0, true, true},
};

}  // namespace

TEST_CASE("SGD through the launch plan equals sgd_update_cpu bitwise", "[cuda][plan][sgd]") {
  std::mt19937 gen(99);
  for (int64_t n = 0; n <= 33; ++n) {
    for (int offset_p = 0; offset_p < 4; ++offset_p) {
      for (int offset_b : {offset_p, (offset_p + 3) % 4}) {
        for (const SgdCase& c : kSgdCases) {
          const std::size_t count = static_cast<std::size_t>(n);
          const GridCase g = kGrids[static_cast<std::size_t>(n + offset_p) % std::size(kGrids)];
          CAPTURE(n, offset_p, offset_b, c.momentum, c.dampening, c.weight_decay, c.nesterov,
                  c.maximize, g.threads, g.max_blocks);
          AlignedFloats gp(count), gg(count), gb(count), cp(count), cg(count), cb(count);
          float* p = gp.at(static_cast<std::size_t>(offset_p));
          float* gr = gg.at(static_cast<std::size_t>(offset_p));
          float* b = gb.at(static_cast<std::size_t>(offset_b));
          const auto p0 = random_values(gen, count, -1.f, 1.f);
          fill(p, p0);
          fill(cp.at(0), p0);
          for (int step = 1; step <= 3; ++step) {
            const auto grad = random_values(gen, count, -1.f, 1.f);
            fill(gr, grad);
            fill(cg.at(0), grad);
            const SgdScalars s = make_sgd_scalars(0.1, c.momentum, c.dampening, c.weight_decay,
                                                  c.nesterov, c.maximize, step == 1);
            sgd_update_cpu(cp.at(0), cg.at(0), cb.at(0), n, s, 1);
            const F32Lanes lanes = f32_lanes(p, gr);
            float* buf = s.use_momentum ? b : nullptr;
            const float* states[] = {buf};
            const VectorPlan plan = f32_update_plan(lanes, n, states, 1);
            const GridShape grid = make_grid_shape(plan.items(), g.threads, g.max_blocks);
            if (s.use_momentum) {
              emulate_launch(plan, grid, MixedSgdItemOp<F32Format, false, true>{lanes, buf, SgdRule{s}});
            } else {
              emulate_launch(plan, grid, MixedSgdItemOp<F32Format, false, false>{lanes, buf, SgdRule{s}});
            }
            CAPTURE(step);
            REQUIRE(same_bits(p, cp.at(0), n));
            if (s.use_momentum) REQUIRE(same_bits(b, cb.at(0), n));
          }
          if (n > 0) REQUIRE_FALSE(same_bits(p, p0.data(), n));
        }
      }
    }
  }
}

TEST_CASE("shards at odd boundaries, each its own launch, equal one CPU update of the whole buffer", "[cuda][plan][shard]") {
  // A flat buffer cut at arbitrary points, as ZeRO ranks cut it: each shard starts wherever
  // the previous one ended, so its misalignment (and hence its head) differs from rank to rank.
  std::mt19937 gen(7);
  const int64_t total = 101;
  const std::vector<std::vector<int64_t>> cuts = {
      {0, 101},
      {0, 50, 101},
      {0, 1, 2, 3, 101},
      {0, 7, 33, 34, 61, 101},
      {0, 26, 52, 78, 101},            // ceil(101/4) per rank
      {0, 15, 30, 45, 60, 75, 90, 101},  // ceil(101/7) per rank
      {0, 0, 101, 101},                // empty shards at both ends
  };
  const std::size_t count = static_cast<std::size_t>(total);
  const auto p0 = random_values(gen, count, -1.f, 1.f);
  const auto m0 = random_values(gen, count, -0.1f, 0.1f);
  const auto v0 = random_values(gen, count, 0.f, 0.01f);
  for (const auto& cut : cuts) {
    for (bool amsgrad : {false, true}) {
      CAPTURE(cut, amsgrad);
      AdamState whole(total, {0, 0, 0, 0, 0});
      AdamState sharded(total, {1, 1, 1, 1, 1});  // the flat buffers start off a 16-byte boundary
      for (AdamState* s : {&whole, &sharded}) {
        fill(s->param(), p0);
        fill(s->exp_avg(), m0);
        fill(s->exp_avg_sq(), v0);
        fill(s->max_exp_avg_sq(), v0);
      }
      for (int64_t step = 1; step <= 2; ++step) {
        const auto grad = random_values(gen, count, -1.f, 1.f);
        fill(whole.grad(), grad);
        fill(sharded.grad(), grad);
        const AdamScalars s =
            make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, true, amsgrad, false, step);
        adam_update_cpu(whole.param(), whole.grad(), whole.exp_avg(), whole.exp_avg_sq(),
                        whole.max_exp_avg_sq(), total, s, 1);
        for (std::size_t r = 0; r + 1 < cut.size(); ++r) {
          const int64_t begin = cut[r];
          const int64_t n = cut[r + 1] - begin;
          const F32Lanes lanes = f32_lanes(sharded.param() + begin, sharded.grad() + begin);
          float* m = sharded.exp_avg() + begin;
          float* v = sharded.exp_avg_sq() + begin;
          float* vmax = amsgrad ? sharded.max_exp_avg_sq() + begin : nullptr;
          const float* states[] = {m, v, vmax};
          const VectorPlan plan = f32_update_plan(lanes, n, states, 3);
          const GridShape grid = make_grid_shape(plan.items(), 32, 2);
          if (amsgrad) {
            emulate_launch(plan, grid, MixedAdamItemOp<F32Format, false, true>{lanes, m, v, vmax, AdamRule{s}});
          } else {
            emulate_launch(plan, grid, MixedAdamItemOp<F32Format, false, false>{lanes, m, v, vmax, AdamRule{s}});
          }
        }
        REQUIRE(same_bits(sharded.param(), whole.param(), total));
        REQUIRE(same_bits(sharded.exp_avg(), whole.exp_avg(), total));
        REQUIRE(same_bits(sharded.exp_avg_sq(), whole.exp_avg_sq(), total));
        if (amsgrad) REQUIRE(same_bits(sharded.max_exp_avg_sq(), whole.max_exp_avg_sq(), total));
      }
    }
  }
}
