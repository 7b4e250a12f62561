// bench/src/muon_step.hpp — the Muon step (--mode step --algorithm muon): Newton-Schulz, update and sync of whole-matrix owners, timed and checked.
#pragma once

#include <memory>
#include <vector>

#include "model.hpp"

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

// The layers' weights (one Muon group, ids 0..k-1) then their biases (one AdamW group, ids
// k..2k-1), in the id order the optimizer registers them.
struct MuonPieces {
  std::vector<Tensor> by_id;
  int64_t matrices = 0;
};
MuonPieces muon_pieces(const Model& model, const std::vector<int>& layers);

// The bench's config for the Muon model: AdamW for the biases' group, the Muon options of -o.
shardopt::OptimizerConfig muon_config(const Options& o);

// A CPU optimizer over `pieces` with the synthetic values of model.cpp (the same global
// indices, so any subset of layers starts from the same numbers). Stage 2 leaves the gradients
// to hand_gradients.
std::unique_ptr<shardopt::ZeroOptimizer> build_muon_optimizer(std::shared_ptr<shardopt::Communicator> comm,
                                                              const Options& o, const shardopt::OptimizerConfig& config,
                                                              const MuonPieces& pieces);

// The --layers x --width model with its L weights in one Muon group and its L biases in one
// AdamW group (Muon as it is used: hidden matrices only); each matrix is owned whole by one
// rank, which orthogonalises it. -w untimed steps, then -n steps each timed as `barrier; t0;
// step(); t1; barrier`; the step and its phases (ZeroOptimizer::last_step(): agreement, update,
// of which Newton-Schulz, and sync) are medians over the steps of the slowest rank's, and the
// Newton-Schulz of the busiest and idlest owner shows the split. The self-check: every rank's
// parameters equal, and each rank's share of the layers equals a single-rank optimizer's over
// them alone. No roofline: the step is bound by the orthogonalisation's flops, not memory.
// Prints one key=value line on rank 0; returns 1 when a parameter was wrong, else 0.
int run_muon_step(const std::shared_ptr<shardopt::Communicator>& comm, const Options& o);

}  // namespace shardopt_bench
