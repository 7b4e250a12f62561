// src/optim/zero_optimizer_impl.hpp — ZeroOptimizer's parts, one per concern, wired in the order data flows through a step.
#pragma once

#include <memory>
#include <optional>

#include "checkpoint/async_save.hpp"
#include "optim/device_context.hpp"
#include "optim/grad_reducer.hpp"
#include "optim/overlap.hpp"
#include "optim/param_sync.hpp"
#include "optim/param_table.hpp"
#include "optim/round_gate.hpp"
#include "optim/shard_state.hpp"
#include "optim/step.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {

struct ZeroOptimizer::Impl {
  Impl(std::shared_ptr<Communicator> comm, const OptimizerConfig& cfg)
      : Impl(optim::overlap_communicator(std::move(comm), cfg), cfg) {}
  Impl(optim::OverlapComm wired, const OptimizerConfig& cfg)
      : config(cfg),
        comm_thread(std::move(wired.thread)),
        overlap_refused(std::move(wired.refused)),
        dev(std::move(wired.comm)),
        table(cfg),
        shard(dev, config, table),
        reducer(dev, config, table, shard),
        sync(dev, config, table, shard),
        step(dev, config, table, shard, sync),
        overlap(comm_thread, dev, config, table, shard, sync, step) {}

  OptimizerConfig config;
  // config.overlap: the thread every communicator call runs on (null when off, and over a
  // communicator that runs on a CUDA stream, which needs none), or why the
  // communicator could not be used from it (the constructor's agreement raises it).
  std::shared_ptr<comm::CommThread> comm_thread;
  std::optional<Error> overlap_refused;
  optim::DeviceContext dev;  // declared before the buffers: its stream outlives them
  optim::ParamTable table;
  optim::ShardState shard;
  optim::GradReducer reducer;
  optim::ParamSync sync;
  optim::Step step;
  // Declared after the buffers its queued work reads and writes: destroyed (drained) first.
  optim::OverlapEngine overlap;
  // The round state the parts above do not hold themselves (round_gate.hpp).
  optim::RoundGate gate;
  // consolidate_state_dict(to)'s result, on rank `to` only.
  std::optional<StateDict> consolidated;
  // How checkpoints stage state between the buffers above and the host (tests set it).
  checkpoint::StagingSettings staging;
  // save_async's writer reads the buffers above: declared last, so it is destroyed (its
  // thread joined) before any of them.
  checkpoint::AsyncSave async_save;
};

ZeroOptimizer::Impl& optimizer_internals(ZeroOptimizer& optimizer);


}  // namespace shardopt
