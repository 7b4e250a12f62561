// src/optim/round.hpp — the gradient round's collective parts, shared by the active ranks' calls and by Join's shadowing: the step's agreed fields, the reduction's divisor, and the overlapped round's open and close.
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

// The hyperparameters (the round's held ones under per_bucket), loss scale and layout every
// step must agree on, as they stand now.
void add_step_fields(ZeroOptimizer::Impl& im, comm::AgreementRecord& record);
// The hash of add_step_fields' record: a rank in join() must step with the active ranks'
// hyperparameters, loss scale and layout, which the step compares through this slot.
uint64_t step_state_hash(ZeroOptimizer::Impl& im);
// Error(mismatch) on every rank when a shadowing rank's step state differs from the reference's.
void check_shadows_step_state(const comm::Agreed& agreed);

// The gradient divisor for a reduction the ranks just agreed on: the ranks that contribute, or
// the world size with config.divide_by_initial_world_size. Also defers stage-2 buckets while
// any rank is in join() (grad_reducer.hpp says why).
void prepare_reduction(ZeroOptimizer::Impl& im, const comm::Agreed& agreed);

// config.overlap: opens a round through the gate (a small agreement: it tells ranks in join()
// to hand zeros, and every rank which ranks contribute; per_bucket agrees on the step's
// hyperparameters, loss scale and layout here and holds them for the round, since buckets are
// updated before step()).
void open_overlapped_round(ZeroOptimizer::Impl& im, const char* operation, bool explicit_hand_over);
// After a round's opening agreement, on active and shadowing ranks alike.
void begin_overlapped_round(ZeroOptimizer::Impl& im, const comm::Agreed& agreed, bool explicit_hand_over);
// After a failed round (its agreement or a bucket's collective): the queued work is waited for,
// the round forgotten and per_bucket's held hyperparameters let go.
void abandon_overlapped_round(ZeroOptimizer::Impl& im) noexcept;
// reduce_gradients() with config.overlap, `entered` its gate record: opens the round if no
// hand-over did, then the ranks agree on the order they completed the buckets in (the first
// round's is learned), the rest is issued and, unless per_bucket, waited for.
void reduce_overlapped(ZeroOptimizer::Impl& im, comm::AgreementRecord entered);

}  // namespace optim
}  // namespace shardopt
