// src/averaging/model_averager_impl.hpp — ModelAverager's internals, shared with PostLocalSGDOptimizer and the local-SGD checkpoints.
#pragma once

#include <memory>
#include <vector>

#include "averaging/replica_groups.hpp"
#include "optim/zero_optimizer_impl.hpp"
#include "shardopt/averaging.hpp"

namespace shardopt {

// The outer optimizer's state over this rank's shard (f32, indexed like the shard).
struct OuterState {
  std::vector<float> anchor;    // the values of the last world-level sync
  std::vector<float> momentum;  // torch SGD's momentum_buffer
  int64_t steps = 0;            // outer steps taken (0: the buffer does not exist yet)
  uint64_t layout_version = 0;  // of the optimizer's layout the vectors follow
};

struct ModelAverager::Impl {
  Impl(std::shared_ptr<Communicator> w, ZeroOptimizer& opt) : world(std::move(w)), optimizer(opt) {}

  std::shared_ptr<Communicator> world;
  ZeroOptimizer& optimizer;
  AveragerConfig config;
  averaging::ReplicaGroups groups;
  int64_t step = 0;
  CommunicationCounts counts;
  OuterState outer;

  ZeroOptimizer::Impl& opt() { return optimizer_internals(optimizer); }
  // The outer optimizer starts from the current values of this rank's shard.
  void snapshot_anchor();
};

}  // namespace shardopt
