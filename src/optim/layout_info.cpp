// src/optim/layout_info.cpp — the partition's view of one registered parameter (a file of its own: the checkpoint readers, fuzzed alone, need it without the param table).
#include "optim/param_table.hpp"

namespace shardopt {
namespace optim {

partition::ParamInfo layout_info(int64_t numel, int32_t group, bool trainable, Algorithm algorithm,
                                 const std::vector<int64_t>& shape, const Hyperparams& group_hyper) {
  partition::ParamInfo info{numel, group, trainable};
  if (algorithm == Algorithm::muon && shape.size() == 2) {
    info.whole = true;
    info.cost = partition::newton_schulz_cost(shape[0], shape[1], group_hyper.ns_steps);
  }
  return info;
}

}  // namespace optim
}  // namespace shardopt
