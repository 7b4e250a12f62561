// src/optim/state_kinds.hpp — the per-element state an optimizer keeps over its shard, by name, and which kinds a configuration needs.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// Per-element f32 buffers over this rank's shard. kMaster: the fp32 master copy of bf16/f16
// parameters (f32 parameters are their own master).
enum StateKind : std::size_t { kExpAvg = 0, kExpAvgSq, kMaxExpAvgSq, kMomentum, kMaster, kStateKinds };
inline constexpr const char* kStateNames[kStateKinds] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                         "momentum_buffer", "master"};

// The kind named `name` (kStateNames), or kStateKinds when none is.
inline std::size_t state_kind_index(const std::string& name) {
  std::size_t k = 0;
  while (k < kStateKinds && name != kStateNames[k]) ++k;
  return k;
}

// Whether a parameter of a group of `algorithm` can hold state of kind k (what its algorithm
// keeps, and the master): a state dict lists only these for it.
inline bool kind_belongs(Algorithm algorithm, std::size_t k) {
  if (k == kMaster) return true;
  if (k == kMomentum) return algorithm == Algorithm::sgd || algorithm == Algorithm::muon;
  return algorithm == Algorithm::adam || algorithm == Algorithm::adamw;
}

// The kinds a parameter of a group of `algorithm` can hold (kind_belongs), as a mask: where its
// shard keeps room for each (place_moments).
inline std::array<bool, kStateKinds> algorithm_kinds(Algorithm algorithm) {
  std::array<bool, kStateKinds> holds{};
  for (std::size_t k = 0; k < kStateKinds; ++k) holds[k] = kind_belongs(algorithm, k);
  return holds;
}

// The state kinds a group of `algorithm` with hyperparameters `h` keeps (the master aside).
inline std::array<bool, kStateKinds> group_state_kinds(Algorithm algorithm, const Hyperparams& h) {
  std::array<bool, kStateKinds> needed{};
  if (algorithm == Algorithm::sgd) {
    needed[kMomentum] = h.momentum != 0.0;
  } else if (algorithm == Algorithm::muon) {
    needed[kMomentum] = true;  // torch.optim.Muon creates its momentum_buffer at the first step
  } else {
    needed[kExpAvg] = needed[kExpAvgSq] = true;
    needed[kMaxExpAvgSq] = h.amsgrad;
  }
  return needed;
}

// Which state kinds an optimizer over `dtype` parameters with these groups keeps: the union
// over the groups (each of its own algorithm) of their kinds. `Algorithms` and `Groups`: any
// ranges indexed by group (the table's deques, a checkpoint's vectors).
template <typename Algorithms, typename Groups>
std::array<bool, kStateKinds> state_kinds_needed(const Algorithms& algorithms, DType dtype, const Groups& groups) {
  std::array<bool, kStateKinds> needed{};
  std::size_t g = 0;
  for (const Hyperparams& h : groups) {
    const std::array<bool, kStateKinds> own = group_state_kinds(algorithms[g++], h);
    for (std::size_t k = 0; k < kStateKinds; ++k) needed[k] = needed[k] || own[k];
  }
  needed[kMaster] = dtype != DType::f32;
  return needed;
}


}  // namespace optim
}  // namespace shardopt
