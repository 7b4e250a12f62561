// python/src/py_state_dict.hpp — StateDict to and from Python: torch's optimizer.state_dict() layout, with numpy arrays for the state tensors.
#pragma once

#include <nanobind/nanobind.h>

#include "shardopt/checkpoint.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// torch's optimizer.state_dict() layout, plus the names shardopt checks on load.
nb::dict state_dict_to_python(const shardopt::StateDict& sd);

// The inverse of state_dict_to_python (as load_state_dict takes it): raises for an unknown
// algorithm or hyperparameter key.
shardopt::StateDict state_dict_from_python(nb::dict d);

}  // namespace shardopt_python
