// src/averaging/model_averager_impl.hpp — ModelAverager's internals, shared with PostLocalSGDOptimizer and the local-SGD checkpoints.
#pragma once

#include <memory>
#include <vector>

#include "averaging/replica_groups.hpp"
#include "optim/averaging_port.hpp"
#include "shardopt/averaging.hpp"

namespace shardopt {

// The outer optimizer's state over this rank's shard (f32, indexed like the shard).
//
// The anchor is where the replicas' current local phase started: the values of the last
// world-level sync, or of wherever the local phase began (construction, the end of warmup,
// set_step, parameters replaced by a load). It goes stale when the parameters may have been
// replaced since it was taken: `provisional` (taken at construction or set_step, before the
// caller may have written weights through the views) or a new values generation of the shard
// (a load, a state dict, a layout change). PostLocalSGDOptimizer retakes a stale anchor when its
// next round begins, before any parameter moves; a ModelAverager on its own, which never sees
// the optimizer's step begin, keeps a provisional anchor and restarts the outer optimizer from
// the next world-level average when the values were replaced.
struct OuterState {
  std::vector<float> anchor;    // the values where the current local phase started
  std::vector<float> momentum;  // torch SGD's momentum_buffer
  int64_t steps = 0;            // outer steps taken (0: the buffer does not exist yet)
  uint64_t values_generation = 0;  // the shard's values generation the vectors follow
  bool provisional = false;        // retake at the next round's start (PostLocalSGDOptimizer)
};

struct ModelAverager::Impl {
  Impl(std::shared_ptr<Communicator> w, ZeroOptimizer& opt) : world(std::move(w)), optimizer(opt), port(opt) {}

  std::shared_ptr<Communicator> world;
  ZeroOptimizer& optimizer;
  optim::AveragingPort port;  // all averaging reaches of the optimizer beyond its public API
  AveragerConfig config;
  averaging::ReplicaGroups groups;
  int64_t step = 0;
  CommunicationCounts counts;
  OuterState outer;

  // The outer optimizer starts afresh from the current values of this rank's shard (momentum
  // zero, no steps taken).
  void take_anchor();
  // Whether the shard's values were replaced (load, state dict, layout change) since the
  // anchor was taken.
  bool anchor_replaced();
  // At the start of a round, before any parameter moves: a stale anchor (provisional, or its
  // values replaced) is retaken from the parameters as they are now. No-op without an outer
  // optimizer.
  void retake_stale_anchor();

  // Join beside averaging (join_refusal_relay.cpp). PostLocalSGDOptimizer averages warmup's
  // gradients over world_peers at the start of every warmup round.
  bool warmup_gradients_cross = false;
  bool join_refusal_relayed = false;  // once per averager: a rank raises the refusal once
  // A Join refusal (optim::is_join_refusal; other errors are ignored) this rank is about to
  // raise: joins the next agreement of each averaging communicator except those in `covered`
  // (whose every rank raised it already), carrying the error, so that the ranks there raise it
  // too instead of waiting for this one. The replica first, then the averaging groups in the
  // order the schedule meets them (warmup's gradients, then the levels from this step on).
  void relay_join_refusal(const Error& e, const std::vector<const Communicator*>& covered);
};

}  // namespace shardopt
