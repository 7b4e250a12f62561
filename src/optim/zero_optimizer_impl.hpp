// src/optim/zero_optimizer_impl.hpp — ZeroOptimizer's parts, one per concern, wired in the order data flows through a step.
#pragma once

#include <memory>
#include <optional>

#include "checkpoint/async_save.hpp"
#include "optim/device_context.hpp"
#include "optim/grad_reducer.hpp"
#include "optim/param_sync.hpp"
#include "optim/param_table.hpp"
#include "optim/shard_state.hpp"
#include "optim/step.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {

struct ZeroOptimizer::Impl {
  Impl(std::shared_ptr<Communicator> comm, const OptimizerConfig& cfg)
      : config(cfg),
        dev(std::move(comm)),
        table(cfg.defaults.value_or(default_hyperparams(cfg.algorithm))),
        shard(dev, config, table),
        reducer(dev, config, table, shard),
        sync(dev, config, table, shard),
        step(dev, config, table, shard, sync) {}

  OptimizerConfig config;
  optim::DeviceContext dev;  // declared before the buffers: its stream outlives them
  optim::ParamTable table;
  optim::ShardState shard;
  optim::GradReducer reducer;
  optim::ParamSync sync;
  optim::Step step;
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
