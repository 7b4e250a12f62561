// tools/demo/train.hpp — one shardopt-demo training run (sharded, replicated or local SGD) and what it reports.
#pragma once

#include <cstdint>
#include <memory>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

// sharded / replicated: one ZeroOptimizer over the world, its state sharded or not.
// local_sgd: PostLocalSGDOptimizer over a ZeroOptimizer (state sharded) per replica.
enum class RunKind { sharded, replicated, local_sgd };

const char* run_kind_name(RunKind kind);

struct ModeResult {
  int64_t params = 0;
  int stage = 1;
  int64_t state_bytes = 0;  // optimizer state plus fp32 masters: all it keeps beyond params/grads
  int64_t grad_bytes = 0;   // gradient memory shardopt owns
  double peak_rss_mb = 0.0;
  double step_ms_median = 0.0;
  // Per iteration, the time spent inside shardopt calls (gradient hand-over, reduce_gradients,
  // clip_grad_norm, step, wait_param): what the trainer sees of the optimizer. The median.
  double visible_ms_median = 0.0;
  // Per iteration, forward/backward plus the optimizer calls after it (not the demo's barriers):
  // with overlap the communication thread's share of the cores shows up here. The median.
  double iter_ms_median = 0.0;
  double params_sum = 0.0;  // local_sgd: of this rank's replica
  double final_loss = 0.0;  // the last step's loss, the mean over all ranks of the world
  int steps = 0;
  // Payload bytes this rank handed to collectives of more than one rank during the steps
  // (counting_comm.hpp). sharded/replicated: all the optimizer's. local_sgd: gradient_bytes +
  // averaging_bytes of communication() plus replica_bytes.
  int64_t comm_bytes = 0;
  // local_sgd only, all over the steps.
  shardopt::CommunicationCounts local;  // PostLocalSGDOptimizer::communication()
  // The replica's ZeroOptimizer outside the gradient calls (its parameter sync, the sync after
  // an averaging, clipping); the gradient calls' share is in communication().gradient_bytes.
  int64_t replica_bytes = 0;
  // Counted here on the replica inside the gradient calls (--verbose prints it).
  int64_t replica_gradient_bytes = 0;
  // Counted here on the world and its splits (the averager's groups): what crossed replicas.
  int64_t world_counted_bytes = 0;
  int replicas = 0;
};

// Builds the MLP's parameters in a ZeroOptimizer (state sharded over the ranks or replicated;
// local_sgd: sharded over the replica, wrapped in PostLocalSGDOptimizer), optionally resumes
// from --resume, runs --steps forward/backward/step iterations, optionally saves to --save,
// checks that every rank of a replica holds the same parameters and returns the numbers rank
// 0 prints. --verbose lines (per-step loss, memory report) are printed here on rank 0.
// `overlap`: sharded/replicated with options.overlap (the backward hands each layer over, the
// forward waits per layer); the demo's own collectives are then left out of the steps.
ModeResult train(const std::shared_ptr<shardopt::Communicator>& world, const Options& options, RunKind kind,
                 bool overlap = false);

}  // namespace shardopt_demo
