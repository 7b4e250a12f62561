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

namespace {

// A bucket-view group of parameters with no initial values: any numel registers without memory.
ParamGroupSpec sized_group(const std::vector<std::pair<std::string, int64_t>>& params) {
  ParamGroupSpec g;
  for (const auto& [name, numel] : params) g.params.push_back(ParamSpec{name, TensorRef{nullptr, numel}, TensorRef{}});
  return g;
}

// The message rank `failing` raises, as every rank sees it.
void require_named_on_every_rank(const std::pair<ErrorCode, std::string>& error, ErrorCode code, const char* operation,
                                 int failing, const std::string& message) {
  REQUIRE(error.first == code);
  if (world()->rank() == failing) {
    REQUIRE_THAT(error.second, Catch::Contains(message));
  } else {
    REQUIRE_THAT(error.second, Catch::Contains(std::string(operation) + " failed on rank " + std::to_string(failing) +
                                               ": " + message));
  }
}

constexpr int64_t k2_55 = int64_t{1} << 55;
// 2^56, the most elements a layout holds: after 8 registered elements, the sum passes it by 8.
constexpr int64_t k2_56 = int64_t{1} << 56;
constexpr int64_t k2_62 = int64_t{1} << 62;

}  // namespace

TEST_CASE("a numel beyond what a layout holds is refused by name on every rank", "[errors]") {
  const int last = world()->size() - 1;
  // INT64_MAX once registered with a null view and a negative shard; now refused.
  auto error = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {sized_group({{"w", 8}, {"huge", INT64_MAX}})}); });
  REQUIRE(error.first == ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("parameter 'huge' has numel 9223372036854775807, more than the "
                                             "72057594037927936 (2^56) elements shardopt lays out"));
  // Four of 2^62 plus one of 16 once wrapped to a 128-byte buffer with 2^62-element views.
  error = error_of([&] {
    ZeroOptimizer(world(), OptimizerConfig{}, {sized_group({{"a", k2_62}, {"b", k2_62}, {"c", k2_62}, {"d", k2_62}, {"e", 16}})});
  });
  REQUIRE(error.first == ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("parameter 'a' has numel 4611686018427387904, more than"));
  // Each within the limit, their sum not.
  error = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {sized_group({{"a", k2_55}, {"b", k2_55}, {"c", k2_55}})}); });
  REQUIRE(error.first == ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("parameter 'c' brings the parameters' elements to 108086391056891904 in "
                                             "all, more than the 72057594037927936 (2^56)"));
  // On one rank only: every rank raises that rank's error, none waits for the timeout.
  const int64_t numel = world()->rank() == last ? INT64_MAX : 8;
  error = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {sized_group({{"w", numel}})}); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "ZeroOptimizer", last,
                              "parameter 'w' has numel 9223372036854775807, more than");
  // add_param_group: the total with the registered parameters, on one rank; nothing changes.
  ZeroOptimizer opt(world(), OptimizerConfig{}, {sized_group({{"w", 8}})});
  const int64_t extra = world()->rank() == last ? k2_56 : 4;
  error = error_of([&] { opt.add_param_group(sized_group({{"extra", extra}})); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "add_param_group", last,
                              "parameter 'extra' brings the parameters' elements to 72057594037927944 in all");
  REQUIRE(opt.num_params() == 1);
  opt.step();  // still usable, and in step on every rank
}

TEST_CASE("a bucket_bytes too small for the model is refused by name: every bucket count fits an int", "[errors]") {
  // bucket_bytes = 1: buckets of 16 elements (the least one holds); 2^36 f32 elements make 2^32
  // of them, past what num_buckets() counts. Refused before anything is allocated, by name.
  OptimizerConfig config;
  config.bucket_bytes = 1;
  const int64_t numel = int64_t{1} << 36;
  auto error = error_of([&] { ZeroOptimizer(world(), config, {sized_group({{"w", numel}})}); });
  REQUIRE(error.first == ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("config.bucket_bytes = 1 cuts the parameters (68719476736 elements of f32 "
                                             "with every parameter trainable) into ") &&
                                 Catch::Contains(" buckets of 16 elements, more than the 16777216 a step issues"));
  if (world()->size() == 1) {
    REQUIRE_THAT(error.second, Catch::Contains("into 4294967296 buckets") && Catch::Contains("bucket_bytes of at least 16384"));
  }
  // On one rank only, through add_param_group: named on every rank, nothing changes.
  const int last = world()->size() - 1;
  ZeroOptimizer opt(world(), config, {sized_group({{"w", 1000}})});
  const int64_t padded = (1000 + 16 * world()->size() - 1) / (16 * world()->size()) * (16 * world()->size());
  CHECK(opt.num_buckets() == padded / 16);  // a small model in tiny buckets is fine
  error = error_of([&] { opt.add_param_group(sized_group({{"big", world()->rank() == last ? numel : 8}})); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "add_param_group", last,
                              "config.bucket_bytes = 1 cuts the parameters");
  REQUIRE(opt.num_params() == 1);
  opt.step();
}

TEST_CASE("buffers larger than the machine's memory are Error(out_of_memory) on every rank", "[errors]") {
  // 2^40 f32 elements: 4 TiB of parameters, as much of gradients, twice that of Adam's state.
  // Once std::bad_alloc escaped from inside the rebuild, on that rank only.
  const int64_t numel = int64_t{1} << 40;
  OptimizerConfig config;
  config.algorithm = Algorithm::adam;
  auto error = error_of([&] { ZeroOptimizer(world(), config, {sized_group({{"w", numel}})}); });
  REQUIRE(error.first == ErrorCode::out_of_memory);
  REQUIRE_THAT(error.second, Catch::Contains("out of memory: allocating the optimizer's buffers on rank "));
  if (world()->size() == 1) {
    REQUIRE_THAT(error.second, Catch::Contains("takes 17592186044416 bytes (parameters 4398046511104, gradients "
                                               "4398046511104, optimizer state 8796093022208), more than this "
                                               "machine's"));
  }
  REQUIRE(std::string(error_code_name(ErrorCode::out_of_memory)) == "out_of_memory");
  // On one rank only, and through add_param_group.
  const int last = world()->size() - 1;
  ZeroOptimizer opt(world(), config, {sized_group({{"w", 8}})});
  error = error_of([&] { opt.add_param_group(sized_group({{"big", world()->rank() == last ? numel : 8}})); });
  require_named_on_every_rank(error, ErrorCode::out_of_memory, "add_param_group", last,
                              "out of memory: allocating the optimizer's buffers on rank " + std::to_string(last));
  REQUIRE(opt.num_params() == 1);
  opt.step();
}

TEST_CASE("clip_grad_norm with a bad max_norm or norm_type on one rank fails on every rank", "[errors]") {
  Buffers b;
  ZeroOptimizer opt(world(), OptimizerConfig{}, {b.group({{"w", 12}})});
  opt.reduce_gradients();
  const int last = world()->size() - 1;
  const bool bad = world()->rank() == last;
  auto error = error_of([&] { opt.clip_grad_norm(bad ? std::numeric_limits<double>::quiet_NaN() : 1.0); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "clip_grad_norm", last,
                              "clip_grad_norm: max_norm must be a finite number >= 0, got nan");
  error = error_of([&] { opt.clip_grad_norm(bad ? -1.0 : 1.0); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "clip_grad_norm", last,
                              "clip_grad_norm: max_norm must be a finite number >= 0, got -1");
  error = error_of([&] { opt.clip_grad_norm(1.0, bad ? 3.0 : 2.0); });
  require_named_on_every_rank(error, ErrorCode::invalid_argument, "clip_grad_norm", last,
                              "clip_grad_norm: norm_type 3 is not supported (2 or inf)");
  opt.step();  // every rank still in step together
}
