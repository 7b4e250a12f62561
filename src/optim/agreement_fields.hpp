// src/optim/agreement_fields.hpp — what the optimizer's agreement records hold: the config, each group's hyperparameters and each registered parameter, as named fields, and the config's own checks.
#pragma once

#include <cstddef>

#include "comm/agreement.hpp"
#include "optim/param_table.hpp"

namespace shardopt {
namespace optim {

// Throws Error(invalid_argument) naming the first invalid field of `config`.
void validate_config(const OptimizerConfig& config);

// "config.algorithm", ..., "config.defaults.lr": every field but cpu_threads (a local tuning
// that never changes results).
void add_config_fields(const OptimizerConfig& config, comm::AgreementRecord& record);
// "param group {g} lr", ... "param group {g} amsgrad".
void add_group_fields(const Hyperparams& hyper, int group, comm::AgreementRecord& record);
// The new groups' hyperparameters, then "parameter #{first_id + i}" for each new record.
void add_registration_fields(const Registration& registration, std::size_t first_id, int first_group,
                             comm::AgreementRecord& record);

}  // namespace optim
}  // namespace shardopt
