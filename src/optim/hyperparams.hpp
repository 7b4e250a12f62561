// src/optim/hyperparams.hpp — validation of per-group hyperparameters, with messages naming the field.
#pragma once

#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// Throws Error(invalid_argument) naming the group and the field when a value is NaN, out of
// range, or a combination torch rejects (nesterov without momentum or with dampening).
void validate_hyperparams(const Hyperparams& hyper, Algorithm algorithm, int group);

}  // namespace optim
}  // namespace shardopt
