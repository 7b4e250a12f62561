// src/checkpoint/optimizer_access.hpp — what the checkpoint module derives from ZeroOptimizer::Impl without changing it.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {
namespace checkpoint {

std::vector<std::string> state_kind_names(const std::array<bool, optim::kStateKinds>& kinds);

// Error(mismatch) naming the first parameter (or group count) where `manifest` differs from
// what is registered (names, numels, dtypes, groups), or the algorithm. `source` names the
// checkpoint in the message.
void check_same_model(Algorithm algorithm, const std::vector<optim::ParamRecord>& params, std::size_t num_groups,
                      const Manifest& manifest, const std::string& source);

// ZeroOptimizer::Impl is private to ZeroOptimizer: helpers outside its members take it as a
// deduced template parameter (the name is never spelled, so no access is needed).

// Checkpoints move state through host memory; an optimizer on a CUDA device is refused, on
// every rank alike (the device is part of the checked registration), before anything happens.
template <typename ImplT>
void require_host_state(const ImplT& im, const char* what) {
  SHARDOPT_CHECK(!im.on_device(), unsupported,
                 "{}: checkpoints of an optimizer whose parameters are on {} are not supported yet", what,
                 device_name(im.device));
}


}  // namespace checkpoint
}  // namespace shardopt
