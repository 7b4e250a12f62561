// src/optim/state_kinds.hpp — the per-element state an optimizer keeps over its shard, by name, and which kinds a configuration needs.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// Per-element f32 buffers over this rank's shard. kMaster: the fp32 master copy of bf16/f16
// parameters (f32 parameters are their own master).
enum StateKind : std::size_t { kExpAvg = 0, kExpAvgSq, kMaxExpAvgSq, kMomentum, kMaster, kStateKinds };
inline constexpr const char* kStateNames[kStateKinds] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                         "momentum_buffer", "master"};

// Which state kinds an optimizer of `algorithm` over `dtype` parameters with these groups keeps.
// `Groups`: any range of Hyperparams (the table's deque, a checkpoint's vector).
template <typename Groups>
std::array<bool, kStateKinds> state_kinds_needed(Algorithm algorithm, DType dtype, const Groups& groups) {
  std::array<bool, kStateKinds> needed{};
  for (const Hyperparams& h : groups) {
    if (algorithm == Algorithm::sgd) {
      needed[kMomentum] = needed[kMomentum] || h.momentum != 0.0;
    } else {
      needed[kExpAvg] = needed[kExpAvgSq] = true;
      needed[kMaxExpAvgSq] = needed[kMaxExpAvgSq] || h.amsgrad;
    }
  }
  needed[kMaster] = dtype != DType::f32;
  return needed;
}

}  // namespace optim
}  // namespace shardopt
