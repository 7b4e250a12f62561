// tests/parity/golden_data.cpp — reads tools/gen_golden.py's JSON (float.hex strings) and compares against it.
#include "golden_data.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#ifndef SHARDOPT_GOLDEN_DIR_DEFAULT
#error "SHARDOPT_GOLDEN_DIR_DEFAULT must point at tests/data (set by tests/parity/CMakeLists.txt)"
#endif

namespace shardopt_parity {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "shardopt-golden-v1";
constexpr const char* kClipFormat = "shardopt-golden-clip-v1";
constexpr std::size_t kMaxReportedFailures = 8;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(fmt::format("golden data {}: {}", file, what));
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot open (regenerate with tools/gen_golden.py)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path, std::string("not valid JSON: ") + e.what());
  }
}

// Looks a field up with a message naming it, instead of nlohmann's bare "key not found".
const json& field(const json& object, const char* key, const std::string& file,
                  const std::string& where) {
  if (!object.is_object() || !object.contains(key)) fail(file, where + ": missing field '" + key + "'");
  return object.at(key);
}

// float.hex() text ("-0x1.8p-3") is exact for a float32 value; strtof reads it without any
// decimal rounding, so the loaded bits are the bits torch produced.
float parse_hex_float(const json& value, const std::string& file, const std::string& where) {
  if (!value.is_string()) fail(file, where + ": expected a float.hex() string");
  const std::string& text = value.get_ref<const std::string&>();
  errno = 0;
  char* end = nullptr;
  const float f = std::strtof(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(f)) {
    fail(file, where + ": cannot read '" + text + "' as a finite float32");
  }
  // A value with more precision than float32 would mean the file was not made from float32s.
  if (static_cast<double>(f) != std::strtod(text.c_str(), nullptr)) {
    fail(file, where + ": '" + text + "' is not exactly a float32 value");
  }
  return f;
}

std::vector<float> parse_tensor(const json& value, int64_t numel, const std::string& file,
                                const std::string& where) {
  if (!value.is_array() || static_cast<int64_t>(value.size()) != numel) {
    fail(file, fmt::format("{}: expected an array of {} values", where, numel));
  }
  std::vector<float> out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    out.push_back(parse_hex_float(value[i], file, fmt::format("{}[{}]", where, i)));
  }
  return out;
}

shardopt::Algorithm parse_algorithm(const std::string& name, const std::string& file) {
  if (name == "SGD") return shardopt::Algorithm::sgd;
  if (name == "Adam") return shardopt::Algorithm::adam;
  if (name == "AdamW") return shardopt::Algorithm::adamw;
  fail(file, "unknown optimizer '" + name + "'");
}

// Writes one torch-named hyperparameter into Hyperparams. Unknown names are an error: silently
// ignoring an option the generator recorded would compare different math.
void set_hyper(shardopt::Hyperparams& h, const std::string& key, const json& value,
               const std::string& file, const std::string& where) {
  const std::string at = where + "." + key;
  auto number = [&]() {
    if (!value.is_number()) fail(file, at + ": expected a number");
    return value.get<double>();
  };
  auto boolean = [&]() {
    if (!value.is_boolean()) fail(file, at + ": expected true/false");
    return value.get<bool>();
  };
  if (key == "lr") h.lr = number();
  else if (key == "eps") h.eps = number();
  else if (key == "weight_decay") h.weight_decay = number();
  else if (key == "momentum") h.momentum = number();
  else if (key == "dampening") h.dampening = number();
  else if (key == "nesterov") h.nesterov = boolean();
  else if (key == "maximize") h.maximize = boolean();
  else if (key == "amsgrad") h.amsgrad = boolean();
  else if (key == "betas") {
    if (!value.is_array() || value.size() != 2 || !value[0].is_number() || !value[1].is_number()) {
      fail(file, at + ": expected [beta1, beta2]");
    }
    h.beta1 = value[0].get<double>();
    h.beta2 = value[1].get<double>();
  } else {
    fail(file, at + ": hyperparameter unknown to shardopt's Hyperparams");
  }
}

// The fields every case has; `format` tells a plain case from a clip case.
GoldenCase parse_case(const json& doc, const std::string& file, const std::string& name,
                      const char* format) {
  GoldenCase c;
  c.name = name;
  c.file = file;
  if (field(doc, "format", file, "top level").get<std::string>() != format) fail(file, "unknown format");
  if (field(doc, "case", file, "top level").get<std::string>() != name) fail(file, "'case' does not match the file name");
  c.algorithm = parse_algorithm(field(doc, "optimizer", file, "top level").get<std::string>(), file);
  c.steps = field(doc, "steps", file, "top level").get<int>();
  if (c.steps <= 0) fail(file, "'steps' must be positive");

  const json& params = field(doc, "params", file, "top level");
  if (!params.is_array() || params.empty()) fail(file, "'params' must be a non-empty array");
  std::vector<int64_t> numels;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string where = fmt::format("params[{}]", i);
    GoldenParam p;
    p.name = field(params[i], "name", file, where).get<std::string>();
    numels.push_back(field(params[i], "numel", file, where).get<int64_t>());
    p.init = parse_tensor(field(params[i], "init", file, where), numels.back(), file, where + ".init");
    c.params.push_back(std::move(p));
  }

  const json& groups = field(doc, "groups", file, "top level");
  if (!groups.is_array() || groups.empty()) fail(file, "'groups' must be a non-empty array");
  std::vector<int> owner(c.params.size(), -1);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fmt::format("groups[{}]", g);
    GoldenGroup group;
    for (const json& index : field(groups[g], "params", file, where)) {
      const int i = index.get<int>();
      if (i < 0 || i >= static_cast<int>(c.params.size()) || owner[static_cast<std::size_t>(i)] != -1) {
        fail(file, fmt::format("{}: param index {} is out of range or in two groups", where, i));
      }
      owner[static_cast<std::size_t>(i)] = static_cast<int>(g);
      group.params.push_back(i);
    }
    if (group.params.empty()) fail(file, where + ": no params");
    shardopt::Hyperparams start;
    const json& hyper = field(groups[g], "hyperparams", file, where);
    if (!hyper.is_object()) fail(file, where + ".hyperparams: expected an object");
    for (auto it = hyper.begin(); it != hyper.end(); ++it) {
      set_hyper(start, it.key(), it.value(), file, where + ".hyperparams");
    }
    const json& per_step = field(groups[g], "per_step", file, where);
    if (!per_step.is_object() || !per_step.contains("lr")) fail(file, where + ".per_step: needs 'lr'");
    group.hyper_per_step.assign(static_cast<std::size_t>(c.steps), start);
    for (auto it = per_step.begin(); it != per_step.end(); ++it) {
      if (!it.value().is_array() || static_cast<int>(it.value().size()) != c.steps) {
        fail(file, fmt::format("{}.per_step.{}: expected {} values", where, it.key(), c.steps));
      }
      for (int k = 0; k < c.steps; ++k) {
        set_hyper(group.hyper_per_step[static_cast<std::size_t>(k)], it.key(),
                  it.value()[static_cast<std::size_t>(k)], file, fmt::format("{}.per_step[{}]", where, k));
      }
    }
    c.groups.push_back(std::move(group));
  }
  if (std::count(owner.begin(), owner.end(), -1) != 0) fail(file, "a param belongs to no group");

  auto parse_steps = [&](const char* key) {
    const json& steps = field(doc, key, file, "top level");
    if (!steps.is_array() || static_cast<int>(steps.size()) != c.steps) {
      fail(file, fmt::format("'{}' must hold {} steps", key, c.steps));
    }
    std::vector<StepTensors> out;
    for (int k = 0; k < c.steps; ++k) {
      const json& step = steps[static_cast<std::size_t>(k)];
      if (!step.is_array() || step.size() != c.params.size()) {
        fail(file, fmt::format("{}[{}] must hold one tensor per param", key, k));
      }
      StepTensors tensors;
      for (std::size_t i = 0; i < c.params.size(); ++i) {
        tensors.push_back(parse_tensor(step[i], numels[i], file, fmt::format("{}[{}][{}]", key, k, i)));
      }
      out.push_back(std::move(tensors));
    }
    return out;
  };
  c.grads = parse_steps("grads");
  c.expected = parse_steps("expected");
  return c;
}

GoldenCase parse_case(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/golden_" + name + ".json";
  return parse_case(read_json(file), file, name, kFormat);
}

GoldenClipCase parse_clip_case(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/golden_" + name + ".json";
  const json doc = read_json(file);
  GoldenClipCase c;
  c.golden = parse_case(doc, file, name, kClipFormat);
  const int steps = c.golden.steps;
  const json& clip = field(doc, "clip", file, "top level");
  const json& norm_type = field(clip, "norm_type", file, "clip");
  if (norm_type.is_string() && norm_type.get<std::string>() == "inf") {
    c.norm_type = HUGE_VAL;
  } else if (norm_type.is_number() && norm_type.get<double>() == 2.0) {
    c.norm_type = 2.0;
  } else {
    fail(file, "clip.norm_type: expected 2.0 or \"inf\", got " + norm_type.dump());
  }
  auto per_step = [&](const json& object, const char* key, const std::string& where) -> const json& {
    const json& values = field(object, key, file, where);
    if (!values.is_array() || static_cast<int>(values.size()) != steps) {
      fail(file, fmt::format("{}: expected {} values (null where clip_grad_norm_ was not called)", key, steps));
    }
    return values;
  };
  const json& max_norm = per_step(clip, "max_norm", "clip");
  const json& total_norm = per_step(doc, "total_norm", "top level");
  const json& clip_coef = per_step(doc, "clip_coef", "top level");
  for (int k = 0; k < steps; ++k) {
    const std::size_t i = static_cast<std::size_t>(k);
    GoldenClipStep step;
    step.called = !max_norm[i].is_null();
    if (total_norm[i].is_null() != !step.called || clip_coef[i].is_null() != !step.called) {
      fail(file, fmt::format("step {}: max_norm, total_norm and clip_coef must be null together", k + 1));
    }
    if (step.called) {
      if (!max_norm[i].is_number() || !(max_norm[i].get<double>() > 0.0)) {
        fail(file, fmt::format("clip.max_norm[{}]: expected a positive number", k));
      }
      step.max_norm = max_norm[i].get<double>();
      step.total_norm = parse_hex_float(total_norm[i], file, fmt::format("total_norm[{}]", k));
      step.clip_coef = parse_hex_float(clip_coef[i], file, fmt::format("clip_coef[{}]", k));
    }
    c.clip.push_back(step);
  }
  return c;
}

// Reads <dir>/<index_name> and parses every case it lists with `parse`.
template <typename Parse>
auto load_index(const std::string& dir, const char* index_name, const char* format, Parse parse)
    -> std::vector<decltype(parse(dir, std::string()))> {
  const std::string index_file = dir + "/" + index_name;
  const json index = read_json(index_file);
  const json& index_format = field(index, "format", index_file, "top level");
  if (!index_format.is_string() || index_format.get<std::string>() != format) fail(index_file, "unknown format");
  const json& names = field(index, "cases", index_file, "top level");
  if (!names.is_array() || names.empty()) fail(index_file, "'cases' must list at least one case");
  std::vector<decltype(parse(dir, std::string()))> cases;
  for (const json& name : names) {
    const std::string case_name = name.is_string() ? name.get<std::string>() : name.dump();
    try {
      cases.push_back(parse(dir, case_name));
    } catch (const json::exception& e) {  // a field of the wrong JSON type
      fail(dir + "/golden_" + case_name + ".json", e.what());
    }
  }
  return cases;
}

}  // namespace

std::string golden_dir() {
  const char* env = std::getenv("SHARDOPT_GOLDEN_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(SHARDOPT_GOLDEN_DIR_DEFAULT);
}

std::vector<GoldenCase> load_golden_cases(const std::string& dir) {
  return load_index(dir, "golden_index.json", kFormat,
                    [](const std::string& d, const std::string& name) { return parse_case(d, name); });
}

std::vector<GoldenClipCase> load_golden_clip_cases(const std::string& dir) {
  return load_index(dir, "golden_clip_index.json", kClipFormat, parse_clip_case);
}

void Comparison::add(const std::string& where, const float* actual, const std::vector<float>& expected) {
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double a = actual[i];
    const double b = expected[i];
    const double scale = std::max(1.0, std::fabs(b));
    const double rel = std::fabs(a - b) / scale;
    ++checked;
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) ++bitwise_different;
    // Written so that NaN fails: !(x <= tol) rather than x > tol.
    if (!(std::fabs(a - b) <= kRelTolerance * scale)) {
      ++out_of_tolerance;
      if (out_of_tolerance <= static_cast<int64_t>(kMaxReportedFailures)) {
        failures += fmt::format("  {}[{}]: shardopt {:.9g} ({:a}), torch {:.9g} ({:a}), |diff|/max(1,|torch|) = {:.3g}\n",
                                where, i, a, a, b, b, rel);
      }
    }
    if (!(rel <= worst_relative)) worst_relative = rel;  // NaN sticks
  }
}

void Comparison::merge(const Comparison& other) {
  checked += other.checked;
  if (out_of_tolerance < static_cast<int64_t>(kMaxReportedFailures)) failures += other.failures;
  out_of_tolerance += other.out_of_tolerance;
  bitwise_different += other.bitwise_different;
  if (!(other.worst_relative <= worst_relative)) worst_relative = other.worst_relative;
}

std::string Comparison::summary() const {
  return fmt::format("{} values checked, {} out of tolerance, {} not bitwise equal to torch, worst |diff|/max(1,|torch|) = {:.3g}",
                     checked, out_of_tolerance, bitwise_different, worst_relative);
}

}  // namespace shardopt_parity
