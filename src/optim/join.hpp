// src/optim/join.hpp — Join for uneven inputs: what a rank in join() contributes to the calls it shadows, and how the active ranks read it.
//
// A rank out of inputs calls join() and, until every rank has joined, follows the calls of the
// ranks still active through their agreements (comm::agree_with_joined): it contributes zero
// gradients to each reduction, its share of the gradient statistics, and takes the same update
// and sync of its own shard. The active count rides on each agreement (which ranks are
// shadowing), so joining costs no collective of its own.
#pragma once

#include "comm/agreement.hpp"
#include "optim/round.hpp"

namespace shardopt {
namespace optim {

// Every rank's {value, nonfinite} for clip_grad_norm, in rank order (active ranks: slots 0
// and 1; ranks in join(): their norm's slot and flag bit 0); replicated state: this rank's only.
std::vector<kernels::GradStats> clip_parts(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, bool inf_norm);

// One pass of join(): shadows the active ranks' calls until a step has been shadowed (true) or
// every rank is in join() (false). Collective.
bool shadow_until_step(ZeroOptimizer::Impl& im);

}  // namespace optim
}  // namespace shardopt
