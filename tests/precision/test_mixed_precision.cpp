// tests/precision/test_mixed_precision.cpp — bf16/f16 N-rank runs bitwise 1-rank runs, stage 2 and the pipelined sync, the fp32 master, stochastic rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "shardopt/checkpoint.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/shardopt.hpp"
#include "mixed_precision_support.hpp"

using namespace shardopt;
using shardopt_test::busy_hyperparams;
using shardopt_test::error_of;
using shardopt_test::world;
using namespace shardopt_mixed_precision_test;

TEST_CASE("bf16/f16 N-rank runs equal 1-rank runs bitwise, stage 1 and 2", "[precision]") {
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (int stage : {1, 2}) {
      for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
        for (Storage storage : {Storage::bucket_view, Storage::external}) {
          Trial t;
          t.dtype = dtype;
          t.stage = stage;
          t.partition = partition;
          t.storage = storage;
          t.algorithm = stage == 1 ? Algorithm::adamw : Algorithm::sgd;
          t.stochastic = dtype != DType::f32 && storage == Storage::external;
          t.clip = partition == PartitionStrategy::flat ? 0.5 : 0.0;
          t.pipeline = stage == 2 ? 200 : 0;  // 200 bytes: chunks of 96 (16-bit) or 48 (f32) elements
          CAPTURE(trial_name(t));
          const auto sharded = train(world(), t);
          const auto single = train(solo(), t);
          REQUIRE(sharded == single);
          // ...and training moved the params at all.
          Trial still = t;
          still.steps = 0;
          REQUIRE(train(solo(), still) != single);
        }
      }
    }
  }
}

TEST_CASE("stage 2 and the pipelined sync produce the bytes stage 1 produces", "[precision][stage2]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam}) {
      Trial t;
      t.dtype = dtype;
      t.algorithm = algorithm;
      t.clip = 1.0;
      CAPTURE(trial_name(t));
      const auto stage1 = train(world(), t);
      Trial pipelined = t;
      pipelined.pipeline = 64;
      REQUIRE(train(world(), pipelined) == stage1);
      t.stage = 2;
      REQUIRE(train(world(), t) == stage1);
      t.storage = Storage::external;
      REQUIRE(train(world(), t) == stage1);
    }
  }
}

TEST_CASE("the fp32 master follows an fp32 run fed the same rounded gradients", "[precision]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
      CAPTURE(dtype_name(dtype), algorithm_name(algorithm));
      const std::vector<int64_t> sizes = {5, 300, 77};
      // Low-precision values and their exact f32 widening, as the two runs' initial params.
      std::vector<Words> init(sizes.size());
      for (std::size_t i = 0; i < sizes.size(); ++i) init[i] = encode(shardopt_test::seeded_values(static_cast<uint32_t>(7 + i), sizes[i]), dtype);
      auto run = [&](DType run_dtype) {
        OptimizerConfig config;
        config.algorithm = algorithm;
        std::vector<std::vector<float>> f32_init(sizes.size());
        std::vector<std::vector<uint16_t>> low_init(sizes.size());
        ParamGroupSpec group;
        group.hyper = busy_hyperparams(algorithm);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          ParamSpec p;
          p.name = "w" + std::to_string(i);
          if (run_dtype == DType::f32) {
            for (uint32_t w : init[i]) f32_init[i].push_back(widen(static_cast<uint16_t>(w), dtype));
            p.param = TensorRef{f32_init[i].data(), sizes[i], DType::f32, Device::cpu()};
          } else {
            for (uint32_t w : init[i]) low_init[i].push_back(static_cast<uint16_t>(w));
            p.param = TensorRef{low_init[i].data(), sizes[i], dtype, Device::cpu()};
          }
          group.params.push_back(p);
        }
        auto opt = std::make_unique<ZeroOptimizer>(world(), config, std::vector<ParamGroupSpec>{group});
        for (int step = 0; step < 5; ++step) {
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            // Arbitrary (not grid) gradients, rounded to the low precision for both runs.
            const Words g = encode(shardopt_test::seeded_values(static_cast<uint32_t>(50 * step + i), sizes[i], 2.f), dtype);
            const TensorRef view = opt->grad_view(static_cast<ParamId>(i));
            std::vector<float> wide;
            for (uint32_t w : g) wide.push_back(widen(static_cast<uint16_t>(w), dtype));
            if (run_dtype == DType::f32) std::memcpy(view.data, wide.data(), wide.size() * 4);
            else store(g, view.data, dtype);
          }
          opt->step();
        }
        return opt;
      };
      auto reference = run(DType::f32);
      auto mixed = run(dtype);
      mixed->consolidate_state_dict(0);
      if (world()->rank() == 0) {
        const StateDict sd = mixed->state_dict();
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const TensorRef expected = reference->param_view(static_cast<ParamId>(i));
          const std::vector<float>& master = sd.state.at(static_cast<ParamId>(i)).tensors.at("master");
          REQUIRE(std::memcmp(master.data(), expected.data, master.size() * 4) == 0);
          // ...and the param is the master rounded to nearest even.
          const Words param = load(mixed->param_view(static_cast<ParamId>(i)));
          REQUIRE(param == encode(master, dtype));
        }
      }
    }
  }
}

TEST_CASE("stochastic rounding is unbiased and reproducible with a seed", "[precision][rounding]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    const int64_t n = 20000;
    // One SGD step moves every master from 1 by 0.3 of the low precision's spacing at 1.
    const float spacing = dtype == DType::bf16 ? 1.f / 128 : 1.f / 1024;
    const float grad = widen(narrow(0.3f, dtype), dtype) * spacing;  // exactly representable
    auto step_once = [&](uint64_t seed, const std::shared_ptr<Communicator>& comm) {
      OptimizerConfig config;
      config.algorithm = Algorithm::sgd;
      config.stochastic_rounding = true;
      config.rounding_seed = seed;
      ParamGroupSpec group;
      group.hyper.lr = 1.0;
      std::vector<uint16_t> ones(static_cast<std::size_t>(n), narrow(1.f, dtype));
      group.params.push_back(ParamSpec{"p", TensorRef{ones.data(), n, dtype, Device::cpu()}, TensorRef{}});
      ZeroOptimizer opt(comm, config, {group});
      store(Words(static_cast<std::size_t>(n), narrow(-grad, dtype)), opt.grad_view(0).data, dtype);
      opt.step();
      return load(opt.param_view(0));
    };
    const Words a = step_once(11, world());
    REQUIRE(a == step_once(11, world()));
    REQUIRE(a == step_once(11, solo()));
    REQUIRE(a != step_once(12, world()));
    int64_t up = 0;
    double sum = 0;
    for (uint32_t w : a) {
      const float v = widen(static_cast<uint16_t>(w), dtype);
      REQUIRE((v == 1.f || v == 1.f + spacing));
      up += v != 1.f;
      sum += v;
    }
    const double p = static_cast<double>(grad / spacing);
    const double fraction = static_cast<double>(up) / static_cast<double>(n);
    const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    CHECK(std::abs(fraction - p) < 4 * sigma);
    CHECK(std::abs(sum / static_cast<double>(n) - (1.0 + static_cast<double>(grad))) < 4 * sigma * spacing);
  }
}
