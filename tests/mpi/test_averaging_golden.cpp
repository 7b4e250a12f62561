// tests/mpi/test_averaging_golden.cpp — ModelAverager against torch's averagers over gloo (tools/gen_golden_averaging.py): every rank's params after every step, and torch's validation errors.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mpi_test_support.hpp"
#include "shardopt/averaging.hpp"

#ifndef SHARDOPT_GOLDEN_DIR_DEFAULT
#error "SHARDOPT_GOLDEN_DIR_DEFAULT must point at tests/data (set by tests/mpi/CMakeLists.txt)"
#endif

namespace {

using nlohmann::json;
using shardopt_test::world;

constexpr const char* kFormat = "shardopt-golden-averaging-v1";
constexpr const char* kErrorsFormat = "shardopt-golden-averaging-errors-v1";
// The parity tolerance of tests/parity: |a - b| <= 1e-6 * max(1, |b|), b being torch's value
// (a few ulp at the params' magnitudes).
constexpr double kRelTolerance = 1e-6;
constexpr int kMaxReported = 8;

// $SHARDOPT_GOLDEN_DIR if set (freshly generated data), else the tests/data this was built with.
std::string golden_dir() {
  const char* env = std::getenv("SHARDOPT_GOLDEN_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(SHARDOPT_GOLDEN_DIR_DEFAULT);
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(fmt::format("golden data {}: {}", file, what));
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open (regenerate with tools/gen_golden_averaging.py)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path, std::string("not valid JSON: ") + e.what());
  }
}

const json& at(const json& object, const char* key, const std::string& file) {
  if (!object.is_object() || !object.contains(key)) fail(file, std::string("missing field '") + key + "'");
  return object.at(key);
}

// float.hex() text is exact; strtof reads it without decimal rounding, and the value must be a
// float32 exactly, or the file was not made from float32 tensors.
float hex_float(const json& value, const std::string& file) {
  if (!value.is_string()) fail(file, "expected a float.hex() string, got " + value.dump());
  const std::string& text = value.get_ref<const std::string&>();
  errno = 0;
  char* end = nullptr;
  const float f = std::strtof(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(f) ||
      static_cast<double>(f) != std::strtod(text.c_str(), nullptr)) {
    fail(file, "'" + text + "' is not a finite float32 value");
  }
  return f;
}

std::vector<float> tensor(const json& value, int64_t numel, const std::string& file) {
  if (!value.is_array() || static_cast<int64_t>(value.size()) != numel) {
    fail(file, fmt::format("expected an array of {} values", numel));
  }
  std::vector<float> out;
  for (const json& v : value) out.push_back(hex_float(v, file));
  return out;
}

// An averager configuration as the generator writes it, in torch's terms: torch's group sizes
// are rank counts, the last one the world's, which is what AveragingLevel takes as well.
shardopt::AveragerConfig averager_config(const json& doc, const std::string& file) {
  const std::string kind = at(doc, "averager", file).get<std::string>();
  const int64_t warmup = at(doc, "warmup_steps", file).get<int64_t>();
  if (kind == "periodic") return shardopt::periodic_averager(at(doc, "period", file).get<int64_t>(), warmup);
  if (kind != "hierarchical") fail(file, "unknown averager '" + kind + "'");
  std::vector<shardopt::AveragingLevel> levels;
  for (const json& level : at(doc, "levels", file)) {
    if (!level.is_array() || level.size() != 2) fail(file, "a level must be [period, group_size]");
    levels.push_back({level[0].get<int64_t>(), level[1].get<int>()});
  }
  return shardopt::hierarchical_averager(std::move(levels), warmup);
}

using RankTensors = std::vector<std::vector<float>>;  // [param][element]

struct AveragingCase {
  std::string name;
  int world_size = 0;
  shardopt::AveragerConfig config;
  shardopt::Hyperparams hyper;
  int steps = 0;
  std::vector<std::string> param_names;
  std::vector<std::vector<float>> init;
  std::vector<std::vector<RankTensors>> grads;     // [step][rank]
  std::vector<std::vector<RankTensors>> expected;  // [step][rank]: after average_parameters()
  std::vector<int> averaged_group_size;            // [step]: 0 where torch did not average
};

AveragingCase load_case(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/golden_averaging_" + name + ".json";
  const json doc = read_json(file);
  try {
    AveragingCase c;
    c.name = name;
    if (at(doc, "format", file).get<std::string>() != kFormat) fail(file, "unknown format");
    if (at(doc, "case", file).get<std::string>() != name) fail(file, "'case' does not match the file name");
    if (at(doc, "optimizer", file).get<std::string>() != "SGD") fail(file, "only SGD cases are known");
    c.world_size = at(doc, "world_size", file).get<int>();
    c.steps = at(doc, "steps", file).get<int>();
    c.config = averager_config(doc, file);
    c.hyper = shardopt::default_hyperparams(shardopt::Algorithm::sgd);
    for (auto it = at(doc, "hyperparams", file).begin(); it != at(doc, "hyperparams", file).end(); ++it) {
      if (it.key() == "lr") c.hyper.lr = it.value().get<double>();
      else if (it.key() == "momentum") c.hyper.momentum = it.value().get<double>();
      else fail(file, "hyperparameter '" + it.key() + "' is not replayed by this test");
    }
    std::vector<int64_t> numels;
    for (const json& p : at(doc, "params", file)) {
      c.param_names.push_back(at(p, "name", file).get<std::string>());
      numels.push_back(at(p, "numel", file).get<int64_t>());
      c.init.push_back(tensor(at(p, "init", file), numels.back(), file));
    }
    auto per_step = [&](const char* key) {
      const json& steps = at(doc, key, file);
      if (!steps.is_array() || static_cast<int>(steps.size()) != c.steps) fail(file, fmt::format("'{}' needs {} steps", key, c.steps));
      std::vector<std::vector<RankTensors>> out;
      for (const json& step : steps) {
        if (!step.is_array() || static_cast<int>(step.size()) != c.world_size) fail(file, fmt::format("'{}': one entry per rank", key));
        std::vector<RankTensors> ranks;
        for (const json& rank : step) {
          if (!rank.is_array() || rank.size() != numels.size()) fail(file, fmt::format("'{}': one tensor per param", key));
          RankTensors tensors;
          for (std::size_t i = 0; i < numels.size(); ++i) tensors.push_back(tensor(rank[i], numels[i], file));
          ranks.push_back(std::move(tensors));
        }
        out.push_back(std::move(ranks));
      }
      return out;
    };
    c.grads = per_step("grads");
    c.expected = per_step("expected");
    c.averaged_group_size = at(doc, "averaged_group_size", file).get<std::vector<int>>();
    if (static_cast<int>(c.averaged_group_size.size()) != c.steps) fail(file, "'averaged_group_size' needs one entry per step");
    return c;
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    fail(file, e.what());
  }
}

std::vector<AveragingCase> load_cases(const std::string& dir) {
  const std::string file = dir + "/golden_averaging_index.json";
  const json index = read_json(file);
  if (at(index, "format", file) != kFormat) fail(file, "unknown format");
  std::vector<AveragingCase> cases;
  for (const json& name : at(index, "cases", file)) cases.push_back(load_case(dir, name.get<std::string>()));
  if (cases.empty()) fail(file, "lists no case");
  return cases;
}

// Each rank is a replica of its own, as each of torch's ranks keeps a plain local optimizer: a
// ZeroOptimizer over a one-rank communicator.
std::unique_ptr<shardopt::ZeroOptimizer> local_sgd(const std::vector<std::string>& names,
                                                   std::vector<std::vector<float>> init,
                                                   const shardopt::Hyperparams& hyper) {
  shardopt::OptimizerConfig config;
  config.algorithm = shardopt::Algorithm::sgd;
  config.defaults = hyper;
  shardopt::ParamGroupSpec group;
  for (std::size_t i = 0; i < names.size(); ++i) {
    shardopt::ParamSpec p;
    p.name = names[i];
    p.param = shardopt::TensorRef{init[i].data(), static_cast<int64_t>(init[i].size())};
    group.params.push_back(p);
  }
  // Registration copies the initial values into the optimizer's buffers.
  return std::make_unique<shardopt::ZeroOptimizer>(world()->split(world()->rank(), 0), config,
                                                   std::vector<shardopt::ParamGroupSpec>{group});
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Runs one case on this rank; returns a report of the differences from torch (empty: none).
std::string replay(const AveragingCase& c) {
  const int rank = world()->rank();
  auto optimizer = local_sgd(c.param_names, c.init, c.hyper);
  shardopt::ModelAverager averager(world(), *optimizer, c.config);
  std::string report;
  int reported = 0;
  int64_t averages = 0;
  bool rounding_may_differ = false;
  for (int step = 0; step < c.steps; ++step) {
    const auto& grads = c.grads[static_cast<std::size_t>(step)][static_cast<std::size_t>(rank)];
    for (shardopt::ParamId id = 0; id < optimizer->num_params(); ++id) {
      const shardopt::TensorRef g = optimizer->grad_view(id);
      std::memcpy(g.data, grads[static_cast<std::size_t>(id)].data(), g.nbytes());
    }
    optimizer->step();
    const int group_size = c.averaged_group_size[static_cast<std::size_t>(step)];
    if (averager.next_group_size() != group_size) {
      report += fmt::format("  step {}: next_group_size() {}, torch averaged over {}\n", step,
                            averager.next_group_size(), group_size);
    }
    averager.average_parameters();
    if (group_size != 0) ++averages;
    // Averages over 1 or 2 ranks are exact bitwise: x/2 is exact, and a sum of two values is
    // the correctly rounded sum whatever the order. torch sums 4 values in gloo's ring order
    // (which varies along the buffer), shardopt in MPI's, so from the first average over more
    // than 2 ranks on, values may differ in their last bits (and carry that through later
    // steps): compared within the parity tolerance from then on.
    if (group_size > 2) rounding_may_differ = true;
    const auto& expected = c.expected[static_cast<std::size_t>(step)][static_cast<std::size_t>(rank)];
    for (shardopt::ParamId id = 0; id < optimizer->num_params(); ++id) {
      const float* actual = optimizer->param_view(id).as<float>();
      const std::vector<float>& torch_values = expected[static_cast<std::size_t>(id)];
      for (std::size_t i = 0; i < torch_values.size(); ++i) {
        const float a = actual[i];
        const float b = torch_values[i];
        const bool ok = rounding_may_differ
                            ? std::fabs(double{a} - double{b}) <= kRelTolerance * std::max(1.0, std::fabs(double{b}))
                            : same_bits(a, b);
        if (!ok && reported++ < kMaxReported) {
          report += fmt::format("  step {} rank {} {}[{}]: shardopt {:.9g} ({:a}), torch {:.9g} ({:a}){}\n", step,
                                rank, c.param_names[static_cast<std::size_t>(id)], i, a, a, b, b,
                                rounding_may_differ ? " beyond the tolerance" : ", not bitwise equal");
        }
      }
    }
  }
  if (reported > kMaxReported) report += fmt::format("  ... {} differences in all\n", reported);
  if (averager.step() != c.steps) report += fmt::format("  step() is {} after {} steps\n", averager.step(), c.steps);
  if (averager.communication().averages != averages) {
    report += fmt::format("  communication().averages is {}, torch averaged {} times\n",
                          averager.communication().averages, averages);
  }
  return report;
}

}  // namespace

TEST_CASE("ModelAverager matches torch's averagers over gloo, every rank after every step",
          "[averaging][golden]") {
  const std::vector<AveragingCase> cases = load_cases(golden_dir());
  for (const AveragingCase& c : cases) {
    if (c.world_size != world()->size()) continue;  // each case runs at its own world size
    INFO("golden case " << c.name << " at world size " << c.world_size << " (tools/gen_golden_averaging.py)");
    const std::string report = replay(c);
    INFO("differences from torch on rank " << world()->rank() << ":\n" << report);
    CHECK(report.empty());
  }
}

TEST_CASE("ModelAverager refuses what torch's averagers refuse, with torch's wording",
          "[averaging][golden]") {
  const std::string file = golden_dir() + "/golden_averaging_errors.json";
  const json doc = read_json(file);
  REQUIRE(at(doc, "format", file) == kErrorsFormat);
  const json* errors = nullptr;
  for (const json& w : at(doc, "worlds", file)) {
    if (at(w, "world_size", file).get<int>() == world()->size()) errors = &at(w, "errors", file);
  }
  if (errors == nullptr) return;  // recorded at the golden cases' world sizes only
  REQUIRE(!errors->empty());
  auto optimizer = local_sgd({"p0"}, {{0.5f, -0.25f, 1.0f}}, shardopt::default_hyperparams(shardopt::Algorithm::sgd));
  for (const json& e : *errors) {
    const std::string name = at(e, "name", file).get<std::string>();
    const std::string torch_message = at(e, "torch_message", file).get<std::string>();
    const std::string key = at(e, "key", file).get<std::string>();
    INFO(name << ": torch raised " << at(e, "torch_type", file).get<std::string>() << "(\"" << torch_message << "\")");
    // torch's ValueError is shardopt's invalid_argument; the generator records no other type.
    REQUIRE(at(e, "torch_type", file) == "ValueError");
    REQUIRE(torch_message.find(key) != std::string::npos);
    const shardopt::AveragerConfig config = averager_config(at(e, "config", file), file);
    const auto error = shardopt_test::error_of([&] { shardopt::ModelAverager averager(world(), *optimizer, config); });
    INFO("shardopt raised " << shardopt::error_code_name(error.first) << "(\"" << error.second << "\")");
    CHECK(error.first == shardopt::ErrorCode::invalid_argument);
    // torch's wording, its quoting of names included (``period``, 'group_size').
    CHECK(error.second.find(key) != std::string::npos);
  }
}
