// src/optim/fingerprint.hpp — the collective check that every rank registered the same parameters.
#pragma once

#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace optim {

// One line per parameter: everything that must agree across ranks (name, numel, dtype,
// device kind, group).
struct ParamSignature {
  std::string description;  // "'fc.weight' (numel 9, f32, cpu, group 0)"
};

// Collective. `local_error` is this rank's own registration problem ("" when none): it is
// shared so that every rank fails together instead of some waiting forever. Throws on every
// rank: the local error's code/message where there is one; Error(invalid_argument) naming
// the rank when another rank failed; Error(mismatch) naming the first differing parameter.
void check_same_registration(Communicator& comm, const std::vector<ParamSignature>& params,
                             const std::string& what, const std::string& local_error,
                             ErrorCode local_error_code);

}  // namespace optim
}  // namespace shardopt
