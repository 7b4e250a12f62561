// python/src/py_averaging.hpp — model averaging for Python: the averager config, torch's PeriodicModelAverager / HierarchicalModelAverager and PostLocalSGDOptimizer over a Python ZeroOptimizer.
#pragma once

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace shardopt_python {

// Adds OuterOptimizer, AveragerConfig, periodic_averager, hierarchical_averager,
// CommunicationCounts, ModelAverager (and its Periodic/Hierarchical subclasses) and
// PostLocalSGDOptimizer to the module. Needs ZeroOptimizer and Communicator bound first.
void bind_averaging(nb::module_& m);

}  // namespace shardopt_python
