// python/src/py_state_dict.cpp — StateDict to and from Python dicts in torch's optimizer.state_dict() layout (state by global index, param_groups, plus the param names checked on load).
#include "py_state_dict.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "shardopt/checkpoint.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "py_hyperparams.hpp"
#include "py_tensors.hpp"

namespace shardopt_python {

using shardopt::Error;
using shardopt::ErrorCode;

namespace {

nb::object numpy_bytes(const std::vector<uint8_t>& values) {
  auto* heap = new std::vector<uint8_t>(values);
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const std::size_t shape[1] = {heap->size()};
  return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(heap->data(), 1, shape, owner));
}

// exp_avg holds signed codes, exp_avg_sq unsigned ones (bitsandbytes' and torchao's choice).
bool signed_moment(const std::string& kind) { return kind == "exp_avg"; }

// An 8-bit moment as torchao's OptimState8bit's attributes: codes, scale, qmap, signed.
nb::dict q8_to_python(const std::string& kind, const shardopt::Q8State& q) {
  nb::dict d;
  d["codes"] = numpy_bytes(q.codes);
  d["scale"] = numpy_copy(q.scale);
  d["qmap"] = numpy_copy(shardopt::q8_map(signed_moment(kind)));
  d["signed"] = signed_moment(kind);
  return d;
}

shardopt::Q8State q8_from_python(const std::string& kind, nb::dict d) {
  shardopt::Q8State q;
  auto codes = nb::cast<nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>>(d["codes"]);
  auto scale = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(d["scale"]);
  q.codes.assign(codes.data(), codes.data() + codes.size());
  q.scale.assign(scale.data(), scale.data() + scale.size());
  // The codes index shardopt's map: another map (or the other signedness) would decode to other values.
  const std::vector<float> map = shardopt::q8_map(signed_moment(kind));
  if (d.contains("signed") && nb::cast<bool>(d["signed"]) != signed_moment(kind)) {
    throw Error(ErrorCode::invalid_argument, "state dict: 8-bit '" + kind + "' says signed=" +
                                                 (signed_moment(kind) ? "False" : "True") + "; shardopt's " + kind +
                                                 " is " + (signed_moment(kind) ? "signed" : "unsigned"));
  }
  if (d.contains("qmap")) {
    auto qmap = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(d["qmap"]);
    if (qmap.size() != map.size() || !std::equal(map.begin(), map.end(), qmap.data())) {
      throw Error(ErrorCode::invalid_argument,
                  "state dict: 8-bit '" + kind + "' has another qmap than bitsandbytes' dynamic map that shardopt's "
                  "codes index");
    }
  }
  return q;
}

}  // namespace

nb::dict state_dict_to_python(const shardopt::StateDict& sd) {
  nb::dict state;
  for (const auto& [id, ps] : sd.state) {
    nb::dict entry;
    entry["step"] = ps.step;
    for (const auto& [kind, values] : ps.tensors) entry[kind.c_str()] = numpy_copy(values);
    for (const auto& [kind, q] : ps.q8) entry[kind.c_str()] = q8_to_python(kind, q);
    state[nb::int_(id)] = entry;
  }
  nb::list groups;
  for (const shardopt::ParamGroupState& g : sd.param_groups) {
    nb::dict d = hyper_dict(g.hyper);
    const shardopt::Algorithm algorithm = g.settings.algorithm.value_or(sd.algorithm);
    if (algorithm == shardopt::Algorithm::muon) {  // torch.optim.Muon's own group keys
      for (const char* key : {"ns_coefficients", "ns_steps", "adjust_lr_fn"}) d[key] = hyper_value(g.hyper, key);
    }
    if (algorithm != sd.algorithm) d["algorithm"] = shardopt::algorithm_name(algorithm);  // a group of its own algorithm
    d["params"] = nb::cast(g.params);
    groups.append(d);
  }
  nb::dict out;
  out["algorithm"] = shardopt::algorithm_name(sd.algorithm);
  out["param_names"] = nb::cast(sd.param_names);
  out["state"] = state;
  out["param_groups"] = groups;
  return out;
}

shardopt::StateDict state_dict_from_python(nb::dict d) {
  shardopt::StateDict sd;
  const std::string algorithm = nb::cast<std::string>(d["algorithm"]);
  bool known = false;
  for (shardopt::Algorithm a : {shardopt::Algorithm::sgd, shardopt::Algorithm::adam, shardopt::Algorithm::adamw,
                                shardopt::Algorithm::muon}) {
    if (algorithm == shardopt::algorithm_name(a)) {
      sd.algorithm = a;
      known = true;
    }
  }
  if (!known) throw Error(ErrorCode::invalid_argument, "state dict: unknown algorithm '" + algorithm + "'");
  sd.param_names = nb::cast<std::vector<std::string>>(d["param_names"]);
  for (auto [key, value] : nb::borrow<nb::dict>(d["state"])) {
    shardopt::ParamState ps;
    for (auto [kind, tensor] : nb::borrow<nb::dict>(value)) {
      const std::string k = nb::cast<std::string>(kind);
      if (k == "step") {
        ps.step = nb::cast<int64_t>(tensor);
        continue;
      }
      if (nb::isinstance<nb::dict>(tensor)) {
        ps.q8[k] = q8_from_python(k, nb::borrow<nb::dict>(tensor));
        continue;
      }
      auto array = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(tensor);
      ps.tensors[k].assign(array.data(), array.data() + array.size());
    }
    sd.state[nb::cast<shardopt::ParamId>(key)] = std::move(ps);
  }
  for (nb::handle g : nb::borrow<nb::list>(d["param_groups"])) {
    shardopt::ParamGroupState gs;
    for (auto [key, value] : nb::borrow<nb::dict>(g)) {
      const std::string k = nb::cast<std::string>(key);
      if (k == "params") gs.params = nb::cast<std::vector<shardopt::ParamId>>(value);
      else if (k == "algorithm") gs.settings.algorithm = algorithm_from(value);
      else set_hyper(gs.hyper, k, value, "param group key");
    }
    sd.param_groups.push_back(std::move(gs));
  }
  return sd;
}

}  // namespace shardopt_python
