// python/src/py_communicator.hpp — communicators implemented in Python (e.g. over a torch.distributed process group).
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

}  // namespace shardopt_python
