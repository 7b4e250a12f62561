// python/src/py_remote.hpp — the remote optimizer for Python: RemoteOptimizer over numpy arrays, RemoteParam, remote_mpi_world.
#pragma once

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace shardopt_python {

// Adds RemoteParam, RemoteStep, RemoteOptimizer and remote_mpi_world. Needs Communicator and
// Algorithm bound first.
void bind_remote(nb::module_& m);

}  // namespace shardopt_python
