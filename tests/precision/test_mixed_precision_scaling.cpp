// tests/precision/test_mixed_precision_scaling.cpp — loss scaling (an inf on one rank skips the step everywhere) and bf16 checkpoints keeping the fp32 masters and the scale.
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

TEST_CASE("an inf on one rank skips the step on every rank and halves the scale", "[precision][scaling]") {
  const std::vector<int64_t> sizes = {64, 9};
  OptimizerConfig config;
  config.algorithm = Algorithm::adam;
  config.loss_scaling.enabled = true;
  config.loss_scaling.init_scale = 1024;
  config.loss_scaling.growth_interval = 3;
  ParamGroupSpec group;
  std::vector<std::vector<uint16_t>> init(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (uint32_t w : encode(shardopt_test::seeded_values(static_cast<uint32_t>(i), sizes[i]), DType::f16)) init[i].push_back(static_cast<uint16_t>(w));
    group.params.push_back(ParamSpec{"q" + std::to_string(i), TensorRef{init[i].data(), sizes[i], DType::f16, Device::cpu()}, TensorRef{}});
  }
  ZeroOptimizer opt(world(), config, {group});
  // Unscaled reference: the same model without loss scaling, fed unscaled gradients.
  OptimizerConfig plain = config;
  plain.loss_scaling.enabled = false;
  ZeroOptimizer reference(world(), plain, {group});
  REQUIRE(opt.loss_scale() == 1024.0);
  REQUIRE(reference.loss_scale() == 1.0);

  // Averaged over the ranks, as a trainer would: an inf in one rank's local gradients reaches
  // every rank's copy, whichever rank owns that element.
  auto feed = [&](ZeroOptimizer& o, int step, double scale, bool poison) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> g = grid_grads(static_cast<uint32_t>(10 * step + i), sizes[i]);
      for (float& v : g) v *= static_cast<float>(scale);  // a power of two: exact
      if (poison && i == 1) g[4] = INFINITY;
      store(encode(g, DType::f16), o.grad_view(static_cast<ParamId>(i)).data, DType::f16);
    }
    o.reduce_gradients();
  };
  const Words before = load(opt.param_view(0));
  // Only the last rank sees the overflow.
  feed(opt, 0, opt.loss_scale(), world()->rank() == world()->size() - 1);
  opt.step();
  REQUIRE(opt.last_step().skipped);
  REQUIRE(opt.last_step().loss_scale == 1024.0);
  REQUIRE(opt.last_step().skipped_steps == 1);
  REQUIRE(opt.loss_scale() == 512.0);
  REQUIRE(opt.param_step(0) == 0);
  REQUIRE(load(opt.param_view(0)) == before);

  for (int step = 1; step <= 3; ++step) {
    feed(opt, step, opt.loss_scale(), false);
    feed(reference, step, 1.0, false);
    opt.step();
    reference.step();
    REQUIRE_FALSE(opt.last_step().skipped);
    REQUIRE(opt.last_step().loss_scale == 512.0);
  }
  // Three clean steps in a row: the scale grows back.
  REQUIRE(opt.loss_scale() == 1024.0);
  REQUIRE(opt.param_step(0) == 3);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(load(opt.param_view(static_cast<ParamId>(i))) == load(reference.param_view(static_cast<ParamId>(i))));
  }
  // Backoff never goes below min_scale.
  opt.set_loss_scale(1.5);
  feed(opt, 9, 1.0, true);
  opt.step();
  REQUIRE(opt.loss_scale() == 1.0);
}

TEST_CASE("a bf16 checkpoint keeps the fp32 masters: resuming equals not stopping", "[precision][checkpoint]") {
  const std::vector<int64_t> sizes = {300, 41, 5};
  auto make = [&](const std::shared_ptr<Communicator>& comm, PartitionStrategy partition) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.partition = partition;
    ParamGroupSpec group;
    group.hyper = busy_hyperparams(config.algorithm);
    std::vector<std::vector<uint16_t>> init(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (uint32_t w : encode(shardopt_test::seeded_values(static_cast<uint32_t>(3 + i), sizes[i]), DType::bf16)) init[i].push_back(static_cast<uint16_t>(w));
      group.params.push_back(ParamSpec{"c" + std::to_string(i), TensorRef{init[i].data(), sizes[i], DType::bf16, Device::cpu()}, TensorRef{}});
    }
    return std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
  };
  auto train_steps = [&](ZeroOptimizer& opt, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        // Gradients that move params by less than a bf16 step: only the masters remember them.
        std::vector<float> g = shardopt_test::seeded_values(static_cast<uint32_t>(70 * step + i), sizes[i], 1e-3f);
        store(encode(g, DType::bf16), opt.grad_view(static_cast<ParamId>(i)).data, DType::bf16);
      }
      opt.step();
    }
  };
  auto snapshot = [&](const ZeroOptimizer& opt) {
    std::vector<Words> out;
    for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(load(opt.param_view(static_cast<ParamId>(i))));
    return out;
  };
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/bf16";
  auto straight = make(solo(), PartitionStrategy::flat);
  train_steps(*straight, 0, 6);

  auto first = make(world(), PartitionStrategy::flat);
  train_steps(*first, 0, 3);
  first->save(dir);
  // Resumed at another partition (and, against the solo run, another world size).
  auto resumed = make(world(), PartitionStrategy::sorted_greedy);
  resumed->load(dir);
  REQUIRE(snapshot(*resumed) == snapshot(*first));
  train_steps(*resumed, 3, 6);
  REQUIRE(snapshot(*resumed) == snapshot(*straight));
  REQUIRE(resumed->param_step(0) == 6);
}

TEST_CASE("the loss scale and its growth count survive a checkpoint", "[precision][checkpoint][scaling]") {
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  config.loss_scaling.enabled = true;
  config.loss_scaling.init_scale = 256;
  config.loss_scaling.growth_interval = 2;
  std::vector<uint16_t> init(16, narrow(0.5f, DType::f16));
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"s", TensorRef{init.data(), 16, DType::f16, Device::cpu()}, TensorRef{}});
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/scale";
  ZeroOptimizer opt(world(), config, {group});
  auto step_with = [](ZeroOptimizer& o, float g) {
    store(Words(16, narrow(g, DType::f16)), o.grad_view(0).data, DType::f16);
    o.step();
  };
  step_with(opt, INFINITY);  // 256 -> 128
  step_with(opt, 1.f);       // one clean step counted towards growth
  REQUIRE(opt.loss_scale() == 128.0);
  opt.save(dir);
  ZeroOptimizer resumed(world(), config, {group});
  REQUIRE(resumed.loss_scale() == 256.0);
  resumed.load(dir);
  REQUIRE(resumed.loss_scale() == 128.0);
  step_with(resumed, 1.f);  // the second clean step in a row: the scale grows
  REQUIRE(resumed.loss_scale() == 256.0);
}
