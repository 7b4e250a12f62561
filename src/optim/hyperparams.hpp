// src/optim/hyperparams.hpp — validation of per-group hyperparameters, with messages naming the field.
#pragma once

#include <string>

#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// Throws Error(invalid_argument) naming the group and the field when a value is NaN, out of
// range, or a combination torch rejects (nesterov without momentum or with dampening).
void validate_hyperparams(const Hyperparams& hyper, Algorithm algorithm, int group);
// The same, naming them `where` ("config.defaults") instead of a group.
void validate_hyperparams(const Hyperparams& hyper, Algorithm algorithm, const std::string& where);

}  // namespace optim
}  // namespace shardopt
