// python/src/py_hyperparams_view.cpp — HyperparamsView: making one for a group, its checked write, and its equality with views, Hyperparams and param-group dicts.
#include "py_hyperparams_view.hpp"

#include "optim/hyperparams.hpp"
#include "py_hyperparams.hpp"

namespace shardopt_python {

void HyperparamsView::set(const shardopt::Hyperparams& next) const {
  shardopt::ZeroOptimizer& o = opt();
  // The public API has no check of its own: values are otherwise checked at the next step.
  shardopt::optim::validate_hyperparams(next, o.group_algorithm(group), group);
  o.hyperparams(group) = next;
}

HyperparamsView hyperparams_view(nb::handle self, int group) {
  nb::cast<PyZeroOptimizer&>(self).opt->hyperparams(group);  // raises for a group that does not exist
  return HyperparamsView{nb::borrow(self), group};
}

nb::object view_equals(const HyperparamsView& v, nb::handle other) {
  const shardopt::Hyperparams mine = v.get();
  if (nb::isinstance<HyperparamsView>(other)) return nb::bool_(same_hyper(mine, nb::cast<HyperparamsView&>(other).get()));
  if (nb::isinstance<shardopt::Hyperparams>(other)) return nb::bool_(same_hyper(mine, nb::cast<shardopt::Hyperparams&>(other)));
  if (nb::isinstance<nb::dict>(other)) return nb::bool_(hyper_dict(mine).equal(other));
  return nb::borrow(Py_NotImplemented);
}

}  // namespace shardopt_python
