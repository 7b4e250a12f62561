// bench/src/verify.hpp — the step benchmark's self-check: every rank holds the same parameters, bitwise those of a single-rank optimizer that took the same steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model.hpp"
#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// Collective. Every rank hashes its parameters and the hashes are compared (each rank that
// differs from rank 0 counts 1); every rank also rebuilds its 1/N slice of the model in a
// single-rank optimizer (a split communicator), takes `steps` steps and compares bitwise (each
// differing element counts 1). The update rules are elementwise and the step counts agree, so
// a slice is a faithful reference, and the N ranks together cover every element at 1/N of the
// cost. Returns the total over all ranks, the same on every rank.
//
// `comm` is a host communicator (MPI) over the same ranks as the optimizer's; the reference
// always runs on the CPU, so a device optimizer is checked against the CPU path bitwise.
int64_t count_wrong_params(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o, const Model& model,
                           const shardopt::ZeroOptimizer& opt, int steps);

// Host-readable values of the optimizer's param `id`: its view itself on the CPU; a copy into
// `scratch` (resized as needed) when it lives on a device.
using ParamReader = std::function<shardopt::TensorRef(shardopt::ParamId id, std::vector<uint32_t>& scratch)>;

// The same check for an optimizer whose parameters are read through `read` and whose initial
// values arrived as `initial` says (the reference receives them the same way).
int64_t count_wrong_params(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o, const Model& model,
                           const shardopt::ZeroOptimizer& opt, int steps, const ParamReader& read,
                           InitialValues initial);

}  // namespace shardopt_bench
