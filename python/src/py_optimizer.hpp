// python/src/py_optimizer.hpp — the Python ZeroOptimizer: what it holds, param-group dicts into ParamGroupSpecs, and its collective construction.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "py_tensors.hpp"
#include "shardopt/shardopt.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// The Python ZeroOptimizer object: the optimizer, and the DLPack tensors it was built over.
struct PyZeroOptimizer {
  std::vector<DlpackOwner> tensors;  // declared first: released after the optimizer
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
};

// One group: {"params": [(name, tensor[, grad]), ...], "lr": ..., ...}. With external storage
// and no grad given, the tensor's own .grad is used (torch allocates it at the first backward,
// or set it to zeros beforehand).
shardopt::ParamGroupSpec group_from(nb::handle group, const shardopt::OptimizerConfig& config,
                                    std::vector<DlpackOwner>& tensors);

// Takes part in the agreement that the collective call `what` starts with on the other ranks,
// carrying this rank's `failure`, so that they raise it too (with the GIL released).
void join_failed_call(shardopt::Communicator& comm, const char* what, const shardopt::Error& failure);

// Reading Python objects may fail on one rank only (a read-only array, a typo). A failed read
// joins the agreement that the collective call (`what`: "ZeroOptimizer", "add_param_group")
// starts with, carrying the failure, so that the other ranks, inside that call, raise too
// instead of waiting forever; a successful read goes on to the call itself.
template <typename Read>
auto read_collectively(shardopt::Communicator& comm, const char* what, Read&& read) {
  try {
    return read();
  } catch (...) {
    const std::exception_ptr local = std::current_exception();
    shardopt::Error failure(shardopt::ErrorCode::invalid_argument, "could not read the parameters");
    try {
      throw;
    } catch (const shardopt::Error& e) {
      failure = e;
    } catch (const std::exception& e) {
      failure = shardopt::Error(shardopt::ErrorCode::invalid_argument, e.what());
    } catch (...) {
    }
    join_failed_call(comm, what, failure);
    std::rethrow_exception(local);  // the original exception is what this rank reports
  }
}

// ZeroOptimizer(comm, param_groups, config, **hyperparameters): collective.
void init_optimizer(PyZeroOptimizer* self, std::shared_ptr<shardopt::Communicator> comm, nb::sequence groups,
                    const shardopt::OptimizerConfig& config, const nb::kwargs& keywords);

}  // namespace shardopt_python
