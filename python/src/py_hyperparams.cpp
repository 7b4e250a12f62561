// python/src/py_hyperparams.cpp — hyperparameters between Python and C++: the known keys, values, dicts and reprs of a Hyperparams, and the optimizer-level defaults from keyword arguments.
#include "py_hyperparams.hpp"

#include <nanobind/stl/string.h>

#include "optim/hyperparams.hpp"

namespace shardopt_python {

using shardopt::Error;
using shardopt::ErrorCode;

namespace {

const char* const kHyperKeys[] = {"lr",       "betas",     "beta1",   "beta2",           "eps",
                                  "weight_decay", "momentum", "dampening", "nesterov", "maximize",
                                  "amsgrad",  "ns_coefficients", "ns_steps", "adjust_lr_fn"};

}  // namespace

std::array<double, 3> ns_coefficients_from(nb::handle value) {
  const auto values = nb::cast<std::vector<double>>(value);
  if (values.size() != 3) throw Error(ErrorCode::invalid_argument, "ns_coefficients must be three numbers (a, b, c)");
  return {values[0], values[1], values[2]};
}

shardopt::MuonLrAdjust lr_adjust_from(nb::handle value) {
  if (value.is_none()) return shardopt::MuonLrAdjust::none;
  const std::string name = nb::cast<std::string>(value);
  for (auto a : {shardopt::MuonLrAdjust::original, shardopt::MuonLrAdjust::match_rms_adamw,
                 shardopt::MuonLrAdjust::spectral_unclamped}) {
    if (name == shardopt::muon_lr_adjust_name(a)) return a;
  }
  throw Error(ErrorCode::invalid_argument,
              "adjust_lr_fn '" + name + "' is not None, 'original', 'match_rms_adamw' or 'spectral_unclamped'");
}

shardopt::Algorithm algorithm_from(nb::handle value) {
  if (nb::isinstance<shardopt::Algorithm>(value)) return nb::cast<shardopt::Algorithm>(value);
  const std::string name = nb::cast<std::string>(value);
  for (auto a : {shardopt::Algorithm::sgd, shardopt::Algorithm::adam, shardopt::Algorithm::adamw,
                 shardopt::Algorithm::muon}) {
    if (name == shardopt::algorithm_name(a)) return a;
  }
  throw Error(ErrorCode::invalid_argument, "algorithm '" + name + "' is not sgd, adam, adamw or muon");
}

[[noreturn]] void unknown_key(const std::string& key, const char* where) {
  std::string known;
  for (const char* k : kHyperKeys) known += std::string(known.empty() ? "" : ", ") + k;
  throw Error(ErrorCode::invalid_argument, "unknown " + std::string(where) + " '" + key + "' (" + known + ")");
}

nb::object hyper_value(const shardopt::Hyperparams& h, const std::string& key) {
  if (key == "lr") return nb::float_(h.lr);
  if (key == "betas") return nb::make_tuple(h.beta1, h.beta2);
  if (key == "beta1") return nb::float_(h.beta1);
  if (key == "beta2") return nb::float_(h.beta2);
  if (key == "eps") return nb::float_(h.eps);
  if (key == "weight_decay") return nb::float_(h.weight_decay);
  if (key == "momentum") return nb::float_(h.momentum);
  if (key == "dampening") return nb::float_(h.dampening);
  if (key == "nesterov") return nb::bool_(h.nesterov);
  if (key == "maximize") return nb::bool_(h.maximize);
  if (key == "amsgrad") return nb::bool_(h.amsgrad);
  if (key == "ns_coefficients") return nb::make_tuple(h.ns_coefficients[0], h.ns_coefficients[1], h.ns_coefficients[2]);
  if (key == "ns_steps") return nb::int_(h.ns_steps);
  if (key == "adjust_lr_fn") {
    if (h.adjust_lr_fn == shardopt::MuonLrAdjust::none) return nb::none();
    return nb::str(shardopt::muon_lr_adjust_name(h.adjust_lr_fn));
  }
  unknown_key(key, "hyperparameter");
}

bool same_hyper(const shardopt::Hyperparams& a, const shardopt::Hyperparams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
         a.nesterov == b.nesterov && a.maximize == b.maximize && a.amsgrad == b.amsgrad &&
         a.ns_coefficients == b.ns_coefficients && a.ns_steps == b.ns_steps && a.adjust_lr_fn == b.adjust_lr_fn;
}

std::string hyper_text(const shardopt::Hyperparams& h) {
  const auto f = [](double v) { return std::string(nb::repr(nb::float_(v)).c_str()); };
  const auto b = [](bool v) { return std::string(v ? "True" : "False"); };
  return "lr=" + f(h.lr) + ", betas=(" + f(h.beta1) + ", " + f(h.beta2) + "), eps=" + f(h.eps) +
         ", weight_decay=" + f(h.weight_decay) + ", momentum=" + f(h.momentum) + ", dampening=" + f(h.dampening) +
         ", nesterov=" + b(h.nesterov) + ", maximize=" + b(h.maximize) + ", amsgrad=" + b(h.amsgrad);
}

nb::dict hyper_dict(const shardopt::Hyperparams& h) {
  nb::dict d;
  d["lr"] = h.lr;
  d["betas"] = nb::make_tuple(h.beta1, h.beta2);
  d["eps"] = h.eps;
  d["weight_decay"] = h.weight_decay;
  d["momentum"] = h.momentum;
  d["dampening"] = h.dampening;
  d["nesterov"] = h.nesterov;
  d["maximize"] = h.maximize;
  d["amsgrad"] = h.amsgrad;
  return d;
}

shardopt::Hyperparams defaults_from(const shardopt::OptimizerConfig& config, const nb::kwargs& keywords) {
  shardopt::Hyperparams defaults = config.defaults.value_or(shardopt::default_hyperparams(config.algorithm));
  for (auto [key, value] : keywords) set_hyper(defaults, nb::cast<std::string>(key), value, "keyword hyperparameter");
  try {
    shardopt::optim::validate_hyperparams(defaults, config.algorithm, 0);
  } catch (const Error& e) {
    // The check speaks of a group ("param group 0: invalid lr ..."); these are the defaults.
    std::string message = e.what();
    const std::string group_prefix = "param group 0: ";
    if (message.rfind(group_prefix, 0) == 0) message.erase(0, group_prefix.size());
    throw Error(e.code(), "defaults: " + message);
  }
  return defaults;
}

}  // namespace shardopt_python
