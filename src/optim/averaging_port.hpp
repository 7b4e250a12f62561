// src/optim/averaging_port.hpp — the narrow interface through which model averaging reaches a ZeroOptimizer: what the replica is, this rank's shard values, the order of work, and publishing averaged values.
//
// src/averaging uses this class only, never the optimizer's internals: averaging reads and
// writes the f32 values this rank updates (parameters, or fp32 masters of 16-bit ones),
// averages warmup gradients before the optimizer reduces them, and hands the result back
// through publish_shard_values(), which keeps 16-bit parameters and the replica's other ranks
// consistent.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/agreement.hpp"
#include "optim/param_table.hpp"
#include "optim/round_gate.hpp"
#include "partition/partition.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

// A piece of this rank's shard: `count` f32 values at `data`, at `shard_offset` in the shard.
struct ValueSpan {
  float* data = nullptr;
  int64_t count = 0;
  int64_t shard_offset = 0;
};

class AveragingPort {
 public:
  explicit AveragingPort(ZeroOptimizer& optimizer);

  // ---- what the replica is ----
  const OptimizerConfig& config() const;
  // Every registered parameter in id order (names, sizes, dtypes, trainable flags).
  const std::vector<ParamRecord>& params() const;
  // Error(invalid_argument) naming the id when out of range.
  const ParamRecord& param(ParamId id) const;
  DType dtype() const;
  bool on_device() const;
  Device device() const;
  // The replica's ranks (the optimizer's communicator), for collectives on host memory.
  Communicator& replica() const;
  int replica_rank() const;
  int replica_size() const;

  // ---- this rank's shard ----
  const partition::RankShard& own_shard() const;
  int64_t trainable_numel() const;  // over the replica's ranks
  // Bumps whenever the shard's values are replaced from outside the update (a checkpoint or
  // state dict installed, a layout change); writes through param_view are not seen.
  uint64_t values_generation() const;
  // The trainable values this rank updates, segment by segment: the parameters themselves (f32)
  // or their fp32 masters (bf16/f16), the values the next update starts from.
  std::vector<ValueSpan> shard_values() const;
  // Some group keeps its masters as 16-bit remainders (no fp32 array for shard_values()).
  bool masters_in_remainders() const;
  // Stage-2 bucket view keeps no gradient buffer: gradients arrive through reduce_gradient().
  bool gradients_handed_one_by_one() const;
  // Param i's gradient buffer (stage 1, or external storage).
  void* grad_ptr(std::size_t i) const;

  // ---- the order of work ----
  // An averaging call enters the optimizer's round gate (round_gate.hpp): what `call` needs is
  // drained (the last step's queued all-gathers, a background save's reading), and the record
  // returned carries this rank's refusal when the optimizer is inside a gradient round. The
  // caller adds its fields and agrees over whichever ranks the call spans.
  comm::AgreementRecord enter(GateCall call, std::string operation);
  // An averager wraps the optimizer from attach() to detach(): the gate then refuses join()
  // (round_gate.cpp says why), naming `world_rank`, and hands every Join refusal this rank
  // raises out of the optimizer's agreements to `relay` (round_gate.hpp: relay_join_refusal).
  void attach(int world_rank, std::function<void(const Error&)> relay);
  void detach() noexcept;
  // Waits for the communication thread's queued work (config.overlap): the last step's
  // all-gathers land before the values are read.
  void wait_for_queued_work();
  // Collective over the replica, after the shard values changed: 16-bit parameters take their
  // masters rounded to nearest even, then the parameter sync spreads every rank's shard.
  void publish_shard_values(int threads);

 private:
  ZeroOptimizer::Impl& im_;
};

}  // namespace optim
}  // namespace shardopt
