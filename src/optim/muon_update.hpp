// src/optim/muon_update.hpp — the update of one Muon matrix of this rank's shard: its scalars from the group's hyperparameters and shape, then the CPU kernel (or the device's).
#pragma once

#include <string>

#include "cpu/muon_cpu.hpp"
#include "optim/shard_state.hpp"

namespace shardopt {
namespace optim {

// Why Muon cannot run on CUDA parameters here ("" where it can: a CUDA build that loads
// cuBLAS). Checked at registration, on every rank.
std::string muon_cuda_unavailable_reason();

class MuonUpdate {
 public:
  MuonUpdate(const DeviceContext& dev, const OptimizerConfig& config, const ShardState& shard)
      : dev_(dev), config_(config), shard_(shard) {}

  // `run` is the whole of matrix `p` (Muon runs never merge, and a Muon matrix is never split
  // between ranks); its momentum buffer is the shard's momentum state over the run.
  void update(const UpdateRun& run, const ParamRecord& p, const Hyperparams& h, const kernels::GradTransform& transform);

  // Seconds spent orthogonalising since the last call (StepReport::newton_schulz_seconds).
  double take_newton_schulz_seconds() {
    const double seconds = workspace_.newton_schulz_seconds;
    workspace_.newton_schulz_seconds = 0.0;
    return seconds;
  }

 private:
  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  const ShardState& shard_;
  kernels::MuonWorkspace workspace_;  // grows to the largest matrix, then kept
};

}  // namespace optim
}  // namespace shardopt
