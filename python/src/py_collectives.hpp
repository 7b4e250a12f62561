// python/src/py_collectives.hpp — the Communicator's collectives bound for Python.
#pragma once

#include <nanobind/nanobind.h>

#include "shardopt/communicator.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// Communicator.broadcast/all_gather/all_reduce/reduce_scatter/reduce (and *_async, returning a
// PendingCollective), over tensors exposing __dlpack__ (uint8 for DType.byte); and
// shardopt.python_communicator(impl).
void bind_collectives(nb::module_& m, nb::class_<shardopt::Communicator>& cls);

}  // namespace shardopt_python
