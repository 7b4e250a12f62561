// tests/mpi/test_muon.cpp — an algorithm per param group and Muon's whole-matrix owners: mixed groups equal separate optimizers, N ranks equal one, refusals on every rank, checkpoints across world sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::bitwise_equal;
using shardopt_test::world;

namespace {

std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

// A parameter of the test model: its shape (empty: 1-D), group and initial values.
struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int group = 0;
  std::vector<float> values;
  int64_t numel() const { return static_cast<int64_t>(values.size()); }
};

// Multiples of 2^-12 below 1 in magnitude: sums over up to 4 ranks are exact, so the average of
// every rank's identical gradient is that gradient at any world size.
std::vector<float> exact_values(uint32_t seed, int64_t n) {
  std::vector<float> v = shardopt_test::seeded_values(seed, n);
  for (float& x : v) x = std::round(x * 4096.f) / 4096.f;
  return v;
}

// Groups: 0 AdamW (vectors), 1 Muon (matrices: tall, wide, square, and one larger), 2 SGD with
// momentum, 3 Muon with other hyperparameters.
std::vector<Param> mixed_model() {
  std::vector<Param> m = {
      {"bias0", {}, 0, {}},           {"w_tall", {12, 5}, 1, {}}, {"w_wide", {4, 9}, 1, {}},
      {"norm", {7}, 0, {}},           {"w_square", {8, 8}, 1, {}}, {"w_big", {16, 10}, 1, {}},
      {"sgd0", {}, 2, {}},            {"w_other", {6, 3}, 3, {}},  {"bias1", {}, 0, {}},
  };
  const int64_t vector_sizes[] = {11, 0, 0, 7, 0, 0, 33, 0, 1};
  for (std::size_t i = 0; i < m.size(); ++i) {
    const int64_t n = m[i].shape.size() == 2 ? m[i].shape[0] * m[i].shape[1] : vector_sizes[i];
    m[i].values = exact_values(100u + static_cast<uint32_t>(i), n);
  }
  return m;
}

Algorithm algorithm_of_group(int g) {
  const Algorithm algorithms[] = {Algorithm::adamw, Algorithm::muon, Algorithm::sgd, Algorithm::muon};
  return algorithms[g];
}

GroupHyperparams hyper_of_group(int g) {
  GroupHyperparams h;
  if (g == 0) h.lr = 0.01;
  if (g == 1) h.lr = 0.02;
  if (g == 2) {
    h.lr = 0.05;
    h.momentum = 0.9;
  }
  if (g == 3) {
    h.lr = 0.03;
    h.nesterov = false;
    h.adjust_lr_fn = MuonLrAdjust::match_rms_adamw;
    h.ns_steps = 4;
  }
  return h;
}

// The model's params of the groups in `groups`, each group as one ParamGroupSpec with its own
// algorithm (or, with `algorithm_in_config`, none: the config names it).
std::vector<ParamGroupSpec> specs(std::vector<Param>& model, const std::vector<int>& groups, bool algorithm_in_config) {
  std::vector<ParamGroupSpec> out;
  for (int g : groups) {
    ParamGroupSpec spec;
    spec.hyper = hyper_of_group(g);
    if (!algorithm_in_config) spec.settings.algorithm = algorithm_of_group(g);
    for (Param& p : model) {
      if (p.group != g) continue;
      ParamSpec s;
      s.name = p.name;
      s.param = TensorRef{p.values.data(), p.numel()};
      s.shape = p.shape;
      spec.params.push_back(s);
    }
    out.push_back(spec);
  }
  return out;
}

std::vector<float> gradient_of(const std::string& name, int64_t n, int step) {
  return exact_values(static_cast<uint32_t>(std::hash<std::string>{}(name) % 100000u) + 7u * static_cast<uint32_t>(step), n);
}

void hand_gradients(ZeroOptimizer& opt, int step) {
  shardopt_test::hand_gradients_backward(opt, opt.config().stage, [&](ParamId id) {
    return gradient_of(opt.param_name(id), opt.param_view(id).numel, step);
  });
  opt.reduce_gradients();
}

// Every param's values by name, after `steps` steps from `first_step`.
void train(ZeroOptimizer& opt, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    hand_gradients(opt, s);
    opt.step();
  }
}

std::vector<float> values_by_name(const ZeroOptimizer& opt, const std::vector<std::string>& names) {
  std::vector<float> out;
  for (const std::string& name : names) {
    const TensorRef v = opt.param_view(opt.find_param(name));
    out.insert(out.end(), v.as<float>(), v.as<float>() + v.numel);
  }
  return out;
}

std::vector<std::string> names_of(const std::vector<Param>& model) {
  std::vector<std::string> names;
  for (const Param& p : model) names.push_back(p.name);
  return names;
}

std::vector<float> train_mixed(std::shared_ptr<Communicator> comm, OptimizerConfig config, int steps) {
  std::vector<Param> model = mixed_model();
  ZeroOptimizer opt(comm, specs(model, {0, 1, 2, 3}, false), config);
  train(opt, 0, steps);
  return values_by_name(opt, names_of(model));
}

}  // namespace

TEST_CASE("an optimizer of mixed algorithms equals one optimizer per algorithm, bitwise", "[muon][groups]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      CAPTURE(stage, partition_name(partition));
      OptimizerConfig config;
      config.stage = stage;
      config.partition = partition;
      config.bucket_bytes = 64;
      const std::vector<float> mixed = train_mixed(world(), config, 4);
      // The same params, one optimizer per algorithm, each naming it in its config.
      std::vector<Param> model = mixed_model();
      OptimizerConfig adamw = config, sgd = config, muon = config;
      adamw.algorithm = Algorithm::adamw;
      sgd.algorithm = Algorithm::sgd;
      muon.algorithm = Algorithm::muon;
      ZeroOptimizer a(world(), specs(model, {0}, true), adamw);
      ZeroOptimizer s(world(), specs(model, {2}, true), sgd);
      ZeroOptimizer m(world(), specs(model, {1, 3}, true), muon);
      for (ZeroOptimizer* opt : {&a, &s, &m}) train(*opt, 0, 4);
      for (ZeroOptimizer* opt : {&a, &s, &m}) {
        for (ParamId id = 0; id < opt->num_params(); ++id) {
          const std::string& name = opt->param_name(id);
          std::vector<Param> reference = mixed_model();
          std::size_t index = 0;
          while (reference[index].name != name) ++index;
          int64_t offset = 0;
          for (std::size_t j = 0; j < index; ++j) offset += reference[j].numel();
          const TensorRef v = opt->param_view(id);
          const std::vector<float> separate(v.as<float>(), v.as<float>() + v.numel);
          const std::vector<float> in_mixed(mixed.begin() + offset, mixed.begin() + offset + v.numel);
          CAPTURE(name);
          REQUIRE(bitwise_equal(separate, in_mixed));
        }
      }
      // ...and every param moved.
      std::size_t offset = 0;
      for (const Param& p : mixed_model()) {
        const std::vector<float> now(mixed.begin() + static_cast<std::ptrdiff_t>(offset),
                                     mixed.begin() + static_cast<std::ptrdiff_t>(offset + p.values.size()));
        CAPTURE(p.name);
        if (!p.values.empty()) REQUIRE_FALSE(bitwise_equal(now, p.values));
        offset += p.values.size();
      }
    }
  }
}

TEST_CASE("mixed Muon and AdamW groups: N ranks give the bytes of one rank", "[muon][zero]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (MatrixPrecision precision : {MatrixPrecision::bf16, MatrixPrecision::f32}) {
        for (Storage storage : {Storage::bucket_view, Storage::external}) {
          if (storage == Storage::external && stage == 2) continue;
          CAPTURE(stage, partition_name(partition), static_cast<int>(precision), static_cast<int>(storage));
          OptimizerConfig config;
          config.stage = stage;
          config.partition = partition;
          config.muon.precision = precision;
          config.bucket_bytes = 96;
          const std::vector<float> sharded = train_mixed(world(), config, 3);
          REQUIRE(bitwise_equal(sharded, train_mixed(solo(), config, 3)));
          REQUIRE_FALSE(bitwise_equal(sharded, [] {
            std::vector<float> initial;
            for (const Param& p : mixed_model()) initial.insert(initial.end(), p.values.begin(), p.values.end());
            return initial;
          }()));
        }
      }
    }
  }
}

TEST_CASE("Muon under a pipelined sync and unsharded state: N ranks give the bytes of one rank", "[muon][zero]") {
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    OptimizerConfig config;
    config.bucket_bytes = 96;
    if (variant == 0) {
      // Chunks far smaller than a matrix: each matrix is updated whole by the chunk that holds
      // its first element, and later chunks only send what it wrote.
      config.pipeline_chunk_bytes = 64;
      config.node_shared_params = false;
    } else {
      config.shard_state = false;  // every rank updates every matrix
    }
    const std::vector<float> result = train_mixed(world(), config, 3);
    REQUIRE(bitwise_equal(result, train_mixed(solo(), config, 3)));
    REQUIRE(bitwise_equal(result, train_mixed(world(), OptimizerConfig{}, 3)));
  }
}

TEST_CASE("Muon matrices are owned whole, largest Newton-Schulz cost first to the least-loaded rank", "[muon]") {
  std::vector<Param> model = mixed_model();
  for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
    OptimizerConfig config;
    config.partition = partition;
    ZeroOptimizer opt(world(), specs(model, {0, 1, 2, 3}, false), config);
    // The expected owners, by the rule.
    std::vector<std::pair<double, ParamId>> costs;
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      if (opt.group_algorithm(opt.param_group(id)) != Algorithm::muon) continue;
      const std::vector<int64_t>& s = opt.param_shape(id);
      const double k = static_cast<double>(std::min(s[0], s[1]));
      const int steps = opt.hyperparams(opt.param_group(id)).ns_steps;
      costs.push_back({steps * (4.0 * s[0] * s[1] * k + 2.0 * k * k * k), id});
    }
    std::stable_sort(costs.begin(), costs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<double> load(static_cast<std::size_t>(world()->size()), 0.0);
    for (const auto& [cost, id] : costs) {
      const auto least = std::min_element(load.begin(), load.end());
      CAPTURE(opt.param_name(id));
      REQUIRE(opt.param_owner(id) == static_cast<int>(least - load.begin()));
      *least += cost;
    }
  }
}

TEST_CASE("a non-2-D parameter in a Muon group is refused on every rank, by name", "[muon][errors]") {
  std::vector<Param> model = mixed_model();
  std::vector<ParamGroupSpec> groups = specs(model, {1}, false);
  groups[0].params[1].shape = {36};  // w_wide as a vector
  try {
    ZeroOptimizer opt(world(), groups, OptimizerConfig{});
    FAIL("registration went through");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::invalid_argument);
    REQUIRE_THAT(e.what(), Catch::Contains("'w_wide'") && Catch::Contains("Muon updates 2-D parameters only"));
  }
  groups[0].params[1].shape = {4, 8};  // 32 elements, not 36
  REQUIRE_THROWS_WITH(ZeroOptimizer(world(), groups, OptimizerConfig{}),
                      Catch::Contains("'w_wide' has shape [4, 8] (32 elements) but numel 36"));
}

TEST_CASE("Muon groups refuse per_bucket overlap on every rank, by name", "[muon][errors]") {
  std::vector<Param> model = mixed_model();
  OptimizerConfig config;
  config.overlap = OverlapPolicy::per_bucket;
  REQUIRE_THROWS_WITH(ZeroOptimizer(world(), specs(model, {0, 1}, false), config),
                      Catch::Contains("param group 1 runs Muon") && Catch::Contains("per_bucket"));
  // after_backward overlaps the reductions and still updates each matrix whole, bitwise as off.
  config.overlap = OverlapPolicy::after_backward;
  std::vector<float> overlapped;
  {
    ZeroOptimizer opt(world(), specs(model, {0, 1, 3}, false), config);
    train(opt, 0, 3);
    opt.wait_all();
    overlapped = values_by_name(opt, {"w_tall", "w_big", "bias0", "w_other"});
  }
  std::vector<Param> again = mixed_model();
  ZeroOptimizer plain(world(), specs(again, {0, 1, 3}, false), OptimizerConfig{});
  train(plain, 0, 3);
  REQUIRE(bitwise_equal(overlapped, values_by_name(plain, {"w_tall", "w_big", "bias0", "w_other"})));
}

TEST_CASE("a group's algorithm that differs between ranks is a named mismatch on every rank", "[muon][errors]") {
  if (world()->size() < 2) return;
  std::vector<Param> model = mixed_model();
  std::vector<ParamGroupSpec> groups = specs(model, {0}, false);
  if (world()->rank() == 1) groups[0].settings.algorithm = Algorithm::adam;
  try {
    ZeroOptimizer opt(world(), groups, OptimizerConfig{});
    FAIL("registration went through");
  } catch (const Error& e) {
    REQUIRE(e.code() == ErrorCode::mismatch);
    REQUIRE_THAT(e.what(), Catch::Contains("param group 0 algorithm"));
  }
}
