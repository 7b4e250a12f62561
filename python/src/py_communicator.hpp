// python/src/py_communicator.hpp — communicators implemented in Python (e.g. over a torch.distributed process group), and the Communicator's collectives bound for Python.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "shardopt/communicator.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// A shardopt::Communicator whose collectives are the methods of the Python object `impl`
// (see shardopt/_torch_comm.py for the protocol, which TorchDistCommunicator implements).
// rank, size, backend and cuda_aware (optional: False) are read once, here.
std::shared_ptr<shardopt::Communicator> python_communicator(nb::object impl);

// Communicator.broadcast/all_gather/all_reduce/reduce_scatter/reduce (and *_async, returning a
// PendingCollective), over tensors exposing __dlpack__ (uint8 for DType.byte).
void bind_collectives(nb::module_& m, nb::class_<shardopt::Communicator>& cls);

}  // namespace shardopt_python
