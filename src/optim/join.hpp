// src/optim/join.hpp — Join for uneven inputs: what a rank in join() contributes to the calls it shadows, and how the active ranks read it.
//
// A rank out of inputs calls join() and, until every rank has joined, follows the calls of the
// ranks still active through their agreements (comm::agree_with_joined): it contributes zero
// gradients to each reduction, its share of the gradient statistics, and takes the same update
// and sync of its own shard. The active count rides on each agreement (which ranks are
// shadowing), so joining costs no collective of its own.
#pragma once

#include "comm/agreement.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {
namespace optim {

// Payload slots a shadowing record fills before it knows the call (the active ranks' own
// records use the slots their call defines, listed in zero_optimizer.cpp).
constexpr std::size_t kShadowNormTwo = 0;     // sum of squares of its shard's gradients
constexpr std::size_t kShadowFlags = 1;       // bit 0: a gradient is inf/NaN; bit 1: local_nonfinite()
constexpr std::size_t kShadowNormInf = 2;     // max |g| of its shard's gradients
constexpr std::size_t kStepStateHash = 3;     // hash of the step's agreed fields (both sides)

// The hyperparameters, loss scale and layout every step must agree on, as they stand now.
void add_step_fields(ZeroOptimizer::Impl& im, comm::AgreementRecord& record);
// The hash of add_step_fields' record: a rank in join() must step with the active ranks'
// hyperparameters, loss scale and layout, which the step compares through this slot.
uint64_t step_state_hash(ZeroOptimizer::Impl& im);
// Error(mismatch) on every rank when a shadowing rank's step state differs from the reference's.
void check_shadows_step_state(const comm::Agreed& agreed);

// Every rank's {value, nonfinite} for clip_grad_norm, in rank order (active ranks: slots 0
// and 1; ranks in join(): their norm's slot and flag bit 0); replicated state: this rank's only.
std::vector<kernels::GradStats> clip_parts(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, bool inf_norm);

// The gradient divisor for a reduction the ranks just agreed on: the ranks that contribute, or
// the world size with config.divide_by_initial_world_size. Also defers stage-2 buckets while
// any rank is in join() (grad_reducer.hpp says why).
void prepare_reduction(ZeroOptimizer::Impl& im, const comm::Agreed& agreed);

// One pass of join(): shadows the active ranks' calls until a step has been shadowed (true) or
// every rank is in join() (false). Collective.
bool shadow_until_step(ZeroOptimizer::Impl& im);

}  // namespace optim
}  // namespace shardopt
