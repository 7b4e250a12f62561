// python/src/py_optimizer.cpp — the Python ZeroOptimizer's construction: param-group dicts (torch's layout, tensors by DLPack) into ParamGroupSpecs, read on every rank before the collective create (a failed read fails that create on every rank).
#include "py_optimizer.hpp"

#include <nanobind/stl/string.h>

#include <initializer_list>
#include <utility>

#include "comm/agreement.hpp"
#include "py_hyperparams.hpp"

namespace shardopt_python {

using shardopt::Error;
using shardopt::ErrorCode;

void join_failed_call(shardopt::Communicator& comm, const char* what, const shardopt::Error& failure) {
  nb::gil_scoped_release release;
  // The public API has no way to fail an agreement from outside a call: the one internal reach.
  shardopt::comm::join_failed(comm, what, failure);
}

namespace {

using Groups = std::vector<shardopt::ParamGroupSpec>;

// A group dict's 'state_precision' / 'master': the enum, or its name.
template <typename Enum>
Enum setting_from(nb::handle value, const char* key, std::initializer_list<std::pair<const char*, Enum>> names) {
  if (nb::isinstance<nb::str>(value)) {
    const std::string text = nb::cast<std::string>(value);
    std::string known;
    for (const auto& [name, e] : names) {
      if (text == name) return e;
      known += known.empty() ? std::string("'") + name + "'" : std::string(" or '") + name + "'";
    }
    throw Error(ErrorCode::invalid_argument, "param group key '" + std::string(key) + "': '" + text +
                                                 "' is not " + known);
  }
  try {
    return nb::cast<Enum>(value);
  } catch (const nb::cast_error&) {
    throw Error(ErrorCode::invalid_argument,
                "param group key '" + std::string(key) + "' takes a name or the shardopt enum");
  }
}

// Sets `key` in `settings` when it is one of the group settings; false for other keys.
bool set_setting(shardopt::GroupSettings& settings, const std::string& key, nb::handle value) {
  if (key == "state_precision") {
    settings.state_precision = setting_from<shardopt::StatePrecision>(
        value, "state_precision", {{"fp32", shardopt::StatePrecision::fp32}, {"q8", shardopt::StatePrecision::q8}});
    return true;
  }
  if (key == "master") {
    settings.master = setting_from<shardopt::MasterStorage>(
        value, "master", {{"fp32", shardopt::MasterStorage::fp32}, {"remainder16", shardopt::MasterStorage::remainder16}});
    return true;
  }
  return false;
}

}  // namespace

shardopt::ParamGroupSpec group_from(nb::handle group, const shardopt::OptimizerConfig& config,
                                    std::vector<DlpackOwner>& tensors) {
  if (!nb::isinstance<nb::dict>(group)) {
    throw Error(ErrorCode::invalid_argument, "a param group must be a dict with 'params' and hyperparameters");
  }
  nb::dict d = nb::borrow<nb::dict>(group);
  if (!d.contains("params")) throw Error(ErrorCode::invalid_argument, "a param group has no 'params'");
  shardopt::ParamGroupSpec spec;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    if (k == "algorithm") {
      spec.settings.algorithm = algorithm_from(value);
    } else if (k != "params" && !set_setting(spec.settings, k, value)) {
      set_hyper(spec.hyper, k, value, "param group key");
    }
  }
  for (nb::handle entry : d["params"]) {
    const std::size_t n = nb::len(entry);
    if (!nb::isinstance<nb::tuple>(entry) && !nb::isinstance<nb::list>(entry)) {
      throw Error(ErrorCode::invalid_argument, "each param must be a (name, tensor) or (name, tensor, grad) tuple");
    }
    if (n != 2 && n != 3) {
      throw Error(ErrorCode::invalid_argument, "each param must be a (name, tensor) or (name, tensor, grad) tuple");
    }
    shardopt::ParamSpec p;
    p.name = nb::cast<std::string>(entry[0]);
    nb::object param = entry[1];
    nb::object grad = n == 3 ? nb::object(entry[2]) : nb::none();
    if (grad.is_none() && config.storage == shardopt::Storage::external && nb::hasattr(param, "grad")) {
      grad = param.attr("grad");
    }
    // A matrix's shape (Muon needs it); 1-D and scalar tensors stay shapeless.
    if (nb::hasattr(param, "shape")) {
      const auto shape = nb::cast<std::vector<int64_t>>(nb::tuple(param.attr("shape")));
      if (shape.size() >= 2) p.shape = shape;
    }
    tensors.push_back(take_dlpack(param, "parameter '" + p.name + "'"));
    p.param = tensor_ref(tensors.back(), "parameter '" + p.name + "'");
    if (!grad.is_none()) {
      tensors.push_back(take_dlpack(grad, "gradient of '" + p.name + "'"));
      p.grad = tensor_ref(tensors.back(), "gradient of '" + p.name + "'");
    } else if (config.storage == shardopt::Storage::external) {
      throw Error(ErrorCode::invalid_argument,
                  "parameter '" + p.name + "': external storage needs a gradient buffer: pass (name, param, grad), "
                  "or give the tensor a .grad (e.g. p.grad = torch.zeros_like(p))");
    }
    spec.params.push_back(std::move(p));
  }
  return spec;
}

void init_optimizer(PyZeroOptimizer* self, std::shared_ptr<shardopt::Communicator> comm, nb::sequence groups,
                    const shardopt::OptimizerConfig& config, const nb::kwargs& keywords) {
  if (!comm) throw Error(ErrorCode::invalid_argument, "ZeroOptimizer needs a communicator (got None)");
  std::vector<DlpackOwner> tensors;
  auto [resolved, specs] = read_collectively(*comm, "ZeroOptimizer", [&] {
    shardopt::OptimizerConfig c = config;
    // Only keywords (or config.defaults) make explicit defaults: without, each group's unset keys
    // take its own algorithm's torch defaults (an AdamW group beside a Muon one decays by 0.01).
    if (keywords.size() > 0 || config.defaults) c.defaults = defaults_from(config, keywords);
    Groups out;
    for (nb::handle g : groups) out.push_back(group_from(g, c, tensors));
    return std::make_pair(c, std::move(out));
  });
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
  {
    nb::gil_scoped_release release;
    opt = std::make_unique<shardopt::ZeroOptimizer>(comm, std::move(specs), resolved);
  }
  new (self) PyZeroOptimizer{std::move(tensors), std::move(opt)};
}

}  // namespace shardopt_python
