// python/src/py_hyperparams_view.hpp — HyperparamsView, what opt.hyperparams(g) and opt.param_groups return: one group's hyperparameters, read and written live through the optimizer.
#pragma once

#include <nanobind/nanobind.h>

#include "py_optimizer.hpp"

namespace nb = nanobind;

namespace shardopt_python {

// What opt.hyperparams(g) returns: the optimizer object (kept alive by this reference) and a
// group index, never a reference into the optimizer's storage. Each read or write goes through
// ZeroOptimizer::hyperparams(index) at that moment, so it can neither dangle nor miss a write.
struct HyperparamsView {
  nb::object owner;  // the Python ZeroOptimizer
  int group = 0;

  shardopt::ZeroOptimizer& opt() const { return *nb::cast<PyZeroOptimizer&>(owner).opt; }
  shardopt::Hyperparams get() const { return opt().hyperparams(group); }
  // Checked before it is stored (as the C ABI's set_hyperparams does), so a refused value raises
  // at the assignment and leaves the group as it was.
  void set(const shardopt::Hyperparams& next) const;
};

// The view of `group` of the Python ZeroOptimizer `self`; raises for a group that does not exist.
HyperparamsView hyperparams_view(nb::handle self, int group);

// Equality by value with another view, a Hyperparams or a param-group-style dict of all keys.
nb::object view_equals(const HyperparamsView& v, nb::handle other);

}  // namespace shardopt_python
