// tests/mpi/test_errors.cpp — bad registrations and hyperparameters fail on every rank, by name, without a hang.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

struct Buffers {
  std::vector<std::vector<float>> data;
  ParamGroupSpec group(const std::vector<std::pair<std::string, int64_t>>& params, Hyperparams hyper = {}) {
    ParamGroupSpec g;
    g.hyper = hyper;
    for (const auto& [name, numel] : params) {
      data.emplace_back(static_cast<std::size_t>(numel), 1.0f);
      g.params.push_back(ParamSpec{name, TensorRef{data.back().data(), numel}, TensorRef{}});
    }
    return g;
  }
};

}  // namespace

TEST_CASE("an empty parameter list is refused", "[errors]") {
  const auto [code, what] = error_of([] { ZeroOptimizer(world(), OptimizerConfig{}, {}); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("the parameter list is empty"));
  const auto [code2, what2] = error_of([] { ZeroOptimizer(world(), OptimizerConfig{}, {ParamGroupSpec{}}); });
  REQUIRE(code2 == ErrorCode::invalid_argument);
  REQUIRE_THAT(what2, Catch::Contains("param group 0 has an empty parameter list"));
}

TEST_CASE("mixed dtypes and unsupported devices are refused by parameter name", "[errors]") {
  Buffers b;
  ParamGroupSpec g = b.group({{"w", 8}, {"half", 8}});
  g.params[1].param.dtype = DType::bf16;
  auto [code, what] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {g}); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("parameter 'half' is bf16, but parameter 'w' is f32"));
  g.params[1].param.dtype = DType::f32;
  g.params[1].param.device = Device::cuda(0);
  std::tie(code, what) = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {g}); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("parameter 'half' is on cuda:0"));
}

TEST_CASE("external storage checks its buffers", "[errors]") {
  Buffers b;
  ParamGroupSpec g = b.group({{"w", 8}});
  OptimizerConfig config;
  config.storage = Storage::external;
  auto [code, what] = error_of([&] { ZeroOptimizer(world(), config, {g}); });
  REQUIRE_THAT(what, Catch::Contains("parameter 'w': external storage needs a gradient buffer"));
  std::vector<float> grad(4);
  g.params[0].grad = TensorRef{grad.data(), 4};
  std::tie(code, what) = error_of([&] { ZeroOptimizer(world(), config, {g}); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("gradient (4 elements, f32, cpu) does not match the parameter (8 elements"));
  // bucket view owns gradients
  std::tie(code, what) = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {g}); });
  REQUIRE_THAT(what, Catch::Contains("in bucket_view storage shardopt owns the gradient"));
  ParamGroupSpec dup = b.group({{"x", 1}, {"x", 2}});
  std::tie(code, what) = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {dup}); });
  REQUIRE_THAT(what, Catch::Contains("parameter name 'x' is registered twice"));
}

TEST_CASE("NaN and negative hyperparameters are refused at construction and at step", "[errors]") {
  Buffers b;
  Hyperparams bad;
  bad.lr = std::numeric_limits<double>::quiet_NaN();
  auto [code, what] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {b.group({{"w", 4}}, bad)}); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("param group 0: invalid lr nan"));

  ZeroOptimizer opt(world(), OptimizerConfig{}, {b.group({{"w", 4}})});
  opt.hyperparams(0).beta2 = -0.5;
  std::tie(code, what) = error_of([&] { opt.step(); });
  REQUIRE_THAT(what, Catch::Contains("param group 0: invalid beta2 -0.5"));
  // Fixed, the optimizer works again.
  opt.hyperparams(0).beta2 = 0.999;
  opt.step();
  REQUIRE(opt.param_step(0) == 1);
}

TEST_CASE("a bad hyperparameter on one rank fails the step on every rank", "[errors]") {
  Buffers b;
  ZeroOptimizer opt(world(), OptimizerConfig{}, {b.group({{"w", 40}})});
  const int last = world()->size() - 1;
  if (world()->rank() == last) opt.hyperparams(0).eps = -1.0;
  const auto [code, what] = error_of([&] { opt.step(); });
  REQUIRE(code == ErrorCode::invalid_argument);
  if (world()->rank() == last) {
    REQUIRE_THAT(what, Catch::Contains("param group 0: invalid eps -1"));
  } else {
    REQUIRE_THAT(what, Catch::Contains("step failed on rank " + std::to_string(last) + ": param group 0: invalid eps -1"));
  }
  REQUIRE(opt.param_step(0) == 0);  // nothing was updated anywhere
}

TEST_CASE("mismatched registration names the first differing parameter on every rank", "[errors]") {
  if (world()->size() == 1) return;  // needs a peer to disagree with
  const int last = world()->size() - 1;
  Buffers b;
  std::vector<std::pair<std::string, int64_t>> params = {{"embed", 10}, {"fc.weight", 9}, {"fc.bias", 3}};
  if (world()->rank() == last) params[1].second = 8;  // a different shape on the last rank
  const auto [code, what] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {b.group(params)}); });
  REQUIRE(code == ErrorCode::mismatch);
  REQUIRE_THAT(what, Catch::Contains("ZeroOptimizer: ranks disagree on parameter #1: rank 0 has 'fc.weight' "
                                      "(numel 9, f32, cpu, group 0), rank " + std::to_string(last) +
                                      " has 'fc.weight' (numel 8, f32, cpu, group 0)"));

  // One rank registers fewer params.
  std::vector<std::pair<std::string, int64_t>> fewer = {{"a", 1}, {"b", 2}};
  if (world()->rank() == last) fewer.pop_back();
  const auto [code2, what2] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {b.group(fewer)}); });
  REQUIRE(code2 == ErrorCode::mismatch);
  REQUIRE_THAT(what2, Catch::Contains("ranks disagree on parameter #1: rank 0 has 'b' (numel 2, f32, cpu, group 0), rank " +
                                       std::to_string(last) + " has nothing"));

  // A local error on one rank (empty name) reaches every rank instead of leaving them waiting.
  std::vector<std::pair<std::string, int64_t>> unnamed = {{"a", 1}};
  if (world()->rank() == last) unnamed[0].first = "";
  const auto [code3, what3] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {b.group(unnamed)}); });
  REQUIRE(code3 == ErrorCode::invalid_argument);
  if (world()->rank() != last) {
    REQUIRE_THAT(what3, Catch::Contains("ZeroOptimizer failed on rank " + std::to_string(last) + ": parameter #0 in group 0 has no name"));
  }

  // add_param_group is checked the same way, and a failed add changes nothing.
  ZeroOptimizer opt(world(), OptimizerConfig{}, {b.group({{"w", 5}})});
  std::vector<std::pair<std::string, int64_t>> extra = {{"extra", 4}};
  if (world()->rank() == last) extra[0].first = "other";
  const auto [code4, what4] = error_of([&] { opt.add_param_group(b.group(extra)); });
  REQUIRE(code4 == ErrorCode::mismatch);
  REQUIRE_THAT(what4, Catch::Contains("add_param_group: ranks disagree on parameter #1: rank 0 has 'extra'"));
  REQUIRE(opt.num_params() == 1);
  REQUIRE(opt.num_groups() == 1);
  opt.step();  // still usable, and in step on every rank
}

TEST_CASE("unknown names and ids are refused", "[errors]") {
  Buffers b;
  ZeroOptimizer opt(world(), OptimizerConfig{}, {b.group({{"w", 5}})});
  REQUIRE_THROWS_WITH(opt.find_param("nope"), "no parameter named 'nope' is registered");
  REQUIRE_THROWS_WITH(opt.param_view(3), "parameter id 3 is out of range (0..0)");
  REQUIRE_THROWS_WITH(opt.hyperparams(2), "param group 2 does not exist (there are 1)");
  REQUIRE_THROWS_WITH(ZeroOptimizer(nullptr, OptimizerConfig{}, {}), Catch::Contains("needs a communicator"));
}
