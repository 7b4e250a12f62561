// src/averaging/post_local_sgd_impl.hpp — PostLocalSGDOptimizer's internals, shared with its checkpoints.
#pragma once

#include <string>

#include "averaging/model_averager_impl.hpp"

namespace shardopt {
namespace averaging {

// Collective over the world (local_sgd_checkpoint.cpp): every replica's checkpoint, the
// averager's state, one commit record last.
void save_local_sgd(ModelAverager::Impl& averager, const std::string& dir);
void load_local_sgd(ModelAverager::Impl& averager, const std::string& dir);

}  // namespace averaging
}  // namespace shardopt
