// python/src/py_hyperparams.hpp — hyperparameters between Python and C++: param-group dict keys and keyword arguments in, dicts, values and reprs out, the optimizer-level defaults.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// Raises shardopt.Error naming the key and listing the known ones; `where` names the kind of key.
[[noreturn]] void unknown_key(const std::string& key, const char* where);

// One hyperparameter key of a param-group dict (or a keyword default) into `h`, whose fields are
// optional or not: a group sets only the keys its dict has (torch's semantics), and the rest
// take the optimizer's defaults. `where` names the kind of key in the message.
// Muon's keys: ns_coefficients as three numbers; adjust_lr_fn None or torch's name.
std::array<double, 3> ns_coefficients_from(nb::handle value);
shardopt::MuonLrAdjust lr_adjust_from(nb::handle value);

template <typename Target>
void set_hyper(Target& h, const std::string& key, nb::handle value, const char* where) {
  if (key == "lr") h.lr = nb::cast<double>(value);
  else if (key == "betas") {
    const auto betas = nb::cast<std::vector<double>>(value);
    if (betas.size() != 2) {
      throw shardopt::Error(shardopt::ErrorCode::invalid_argument, "betas must be a pair (beta1, beta2)");
    }
    h.beta1 = betas[0];
    h.beta2 = betas[1];
  } else if (key == "beta1") h.beta1 = nb::cast<double>(value);
  else if (key == "beta2") h.beta2 = nb::cast<double>(value);
  else if (key == "eps") h.eps = nb::cast<double>(value);
  else if (key == "weight_decay") h.weight_decay = nb::cast<double>(value);
  else if (key == "momentum") h.momentum = nb::cast<double>(value);
  else if (key == "dampening") h.dampening = nb::cast<double>(value);
  else if (key == "nesterov") h.nesterov = nb::cast<bool>(value);
  else if (key == "maximize") h.maximize = nb::cast<bool>(value);
  else if (key == "amsgrad") h.amsgrad = nb::cast<bool>(value);
  else if (key == "ns_coefficients") h.ns_coefficients = ns_coefficients_from(value);
  else if (key == "ns_steps") h.ns_steps = nb::cast<int32_t>(value);
  else if (key == "adjust_lr_fn") h.adjust_lr_fn = lr_adjust_from(value);
  else unknown_key(key, where);
}

// A group's "algorithm": a name ("muon") or an Algorithm.
shardopt::Algorithm algorithm_from(nb::handle value);

// The value of one key, as a param-group dict holds it (betas as a tuple).
nb::object hyper_value(const shardopt::Hyperparams& h, const std::string& key);

// Whether every field is equal.
bool same_hyper(const shardopt::Hyperparams& a, const shardopt::Hyperparams& b);

// "lr=0.001, betas=(0.9, 0.999), ..." with Python's own float reprs (the shortest that round-trip).
std::string hyper_text(const shardopt::Hyperparams& h);

// A param-group-style dict of every key (betas as a tuple), as torch's param_groups hold them.
nb::dict hyper_dict(const shardopt::Hyperparams& h);

// The optimizer-level defaults (torch's `defaults`): the constructor's keyword hyperparameters
// over config.defaults, or over torch's defaults for the algorithm. Checked here, so that a bad
// value is refused even when every group sets that key itself, as torch's constructors do.
shardopt::Hyperparams defaults_from(const shardopt::OptimizerConfig& config, const nb::kwargs& keywords);

}  // namespace shardopt_python
