// tests/precision/test_mixed_precision_limits.cpp — the memory report against the ZeRO formulas, and stage 2 / mixed-precision misuse refused by name.
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

TEST_CASE("the memory report matches the ZeRO formulas within the padding", "[precision][memory]") {
  const int n = world()->size();
  const std::vector<int64_t> sizes = {4096, 1000, 24, 7};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  // The flat partition pads the whole to a multiple of N x 16 elements.
  const int64_t padded = (total + 16 * n - 1) / (16 * n) * (16 * n);
  const int64_t shard = padded / n;
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    OptimizerConfig config;
    config.algorithm = Algorithm::adam;
    config.stage = stage;
    config.node_shared_params = false;  // the formulas count a copy of the parameters per rank
    ParamGroupSpec group;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      group.params.push_back(ParamSpec{"m" + std::to_string(i), TensorRef{nullptr, sizes[i], DType::bf16, Device::cpu()}, TensorRef{}});
    }
    ZeroOptimizer opt(world(), config, {group});
    const MemoryReport r = opt.memory_report();
    CHECK(r.param_bytes == 2 * padded);
    CHECK(r.grad_bytes == (stage == 1 ? 2 * padded : 2 * shard));
    CHECK(r.master_bytes == 4 * shard);
    CHECK(r.state_bytes == 8 * shard);
    CHECK(r.shard_numel == shard);
    // Bytes per parameter against 4 + 12/N (stage 1) and 2 + 14/N (stage 2).
    const double per_param = static_cast<double>(r.param_bytes + r.grad_bytes + r.master_bytes + r.state_bytes) / static_cast<double>(total);
    const double formula = stage == 1 ? 4.0 + 12.0 / n : 2.0 + 14.0 / n;
    const double padding = static_cast<double>(padded - total) / static_cast<double>(total);
    CHECK(per_param >= formula);
    CHECK(per_param <= formula * (1 + padding) + 1e-12);
  }
}

TEST_CASE("stage 2 and mixed-precision misuse is refused with errors that name it", "[precision][errors]") {
  std::vector<uint16_t> a(8), b(8);
  std::vector<float> c(8);
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"a", TensorRef{a.data(), 8, DType::bf16, Device::cpu()}, TensorRef{}});
  group.params.push_back(ParamSpec{"b", TensorRef{b.data(), 8, DType::bf16, Device::cpu()}, TensorRef{}});

  SECTION("one dtype per optimizer") {
    ParamGroupSpec mixed = group;
    mixed.params.push_back(ParamSpec{"c", TensorRef{c.data(), 8, DType::f32, Device::cpu()}, TensorRef{}});
    const auto [code, message] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {mixed}); });
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("'c' is f32") && Catch::Contains("parameter 'a' is bf16"));
  }
  SECTION("bad stage and loss-scaling settings") {
    OptimizerConfig config;
    config.stage = 3;
    CHECK_THAT(error_of([&] { ZeroOptimizer(world(), config, {group}); }).second, Catch::Contains("stage must be 1 or 2, got 3"));
    config.stage = 1;
    config.loss_scaling.enabled = true;
    config.loss_scaling.backoff_factor = NAN;
    CHECK_THAT(error_of([&] { ZeroOptimizer(world(), config, {group}); }).second, Catch::Contains("backoff_factor"));
  }
  SECTION("stage 2 hand-over rules") {
    OptimizerConfig config;
    config.stage = 2;
    ZeroOptimizer opt(world(), config, {group});
    // Stage-2 grad views exist where the ranks share one node's gradient slots; at one rank the
    // gradients are handed over.
    if (world()->size() == 1) {
      CHECK_THAT(error_of([&] { opt.grad_view(0); }).second, Catch::Contains("reduce_gradient()"));
    } else {
      CHECK(opt.grad_view(0).numel == 8);
    }
    std::vector<uint16_t> g(8, narrow(0.5f, DType::bf16));
    const TensorRef grad{g.data(), 8, DType::bf16, Device::cpu()};
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, TensorRef{g.data(), 7, DType::bf16, Device::cpu()}); }).second,
               Catch::Contains("'a' has 7 elements"));
    opt.reduce_gradient(0, grad);
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, grad); }).second, Catch::Contains("'a' was already handed"));
    CHECK_THAT(error_of([&] { opt.step(); }).second, Catch::Contains("not finished with reduce_gradients()"));
    // Every rank forgot 'b' alike: an error naming it, never a hang.
    CHECK_THAT(error_of([&] { opt.reduce_gradients(); }).second, Catch::Contains("never handed the gradient of 'b'"));
  }
  SECTION("stage 2 hand-over in another order on one rank") {
    if (world()->size() > 1) {
      OptimizerConfig config;
      config.stage = 2;
      ZeroOptimizer opt(world(), config, {group});
      std::vector<uint16_t> g(8, narrow(0.5f, DType::bf16));
      const TensorRef grad{g.data(), 8, DType::bf16, Device::cpu()};
      const bool reversed = world()->rank() == 1;
      opt.reduce_gradient(reversed ? 1 : 0, grad);
      opt.reduce_gradient(reversed ? 0 : 1, grad);
      const auto [code, message] = error_of([&] { opt.reduce_gradients(); });
      CHECK(code == ErrorCode::mismatch);
      CHECK_THAT(message, Catch::Contains("reduce_gradients: ranks disagree on gradient hand-over order"));
    }
  }
  SECTION("reduce_gradient is for stage 2, clip_grad_norm takes 2 or inf") {
    ZeroOptimizer opt(world(), OptimizerConfig{}, {group});
    std::vector<uint16_t> g(8);
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, TensorRef{g.data(), 8, DType::bf16, Device::cpu()}); }).second,
               Catch::Contains("is for stage 2"));
    CHECK_THAT(error_of([&] { opt.clip_grad_norm(1.0, 1.5); }).second, Catch::Contains("norm_type 1.5"));
    CHECK_THAT(error_of([&] { opt.clip_grad_norm(NAN); }).second, Catch::Contains("max_norm"));
  }
}
