// src/optim/averaging_port.cpp — AveragingPort over the optimizer's parts: the shard's values and masters, the replica communicator, the overlap's queue and the parameter sync.
#include "optim/averaging_port.hpp"

#include "cpu/update_cpu.hpp"
#include "optim/zero_optimizer_impl.hpp"

namespace shardopt {
namespace optim {

AveragingPort::AveragingPort(ZeroOptimizer& optimizer) : im_(optimizer_internals(optimizer)) {}

const OptimizerConfig& AveragingPort::config() const { return im_.config; }
const std::vector<ParamRecord>& AveragingPort::params() const { return im_.table.params(); }
const ParamRecord& AveragingPort::param(ParamId id) const {
  const ParamTable& table = im_.table;
  return table.param(id);
}
DType AveragingPort::dtype() const { return im_.shard.dtype(); }
bool AveragingPort::on_device() const { return im_.dev.on_device(); }
Device AveragingPort::device() const { return im_.dev.device(); }
Communicator& AveragingPort::replica() const { return im_.dev.host_comm(); }
int AveragingPort::replica_rank() const { return im_.dev.rank(); }
int AveragingPort::replica_size() const { return im_.dev.world(); }

const partition::RankShard& AveragingPort::own_shard() const { return im_.shard.own_shard(); }
int64_t AveragingPort::trainable_numel() const { return im_.shard.layout().trainable_numel; }
uint64_t AveragingPort::values_generation() const { return im_.shard.values_generation(); }

std::vector<ValueSpan> AveragingPort::shard_values() const {
  const ShardState& shard = im_.shard;
  std::vector<ValueSpan> spans;
  const DType dt = shard.dtype();
  for (const partition::Segment& s : shard.own_shard().segments) {
    if (s.length == 0) continue;
    float* values = dt == DType::f32
                        ? reinterpret_cast<float*>(element(shard.param_ptr(static_cast<std::size_t>(s.param)),
                                                           s.param_offset, dt))
                        : shard.state_data(kMaster) + s.shard_offset;
    spans.push_back(ValueSpan{values, s.length, s.shard_offset});
  }
  return spans;
}

bool AveragingPort::masters_in_remainders() const { return im_.table.any_master(MasterStorage::remainder16); }

bool AveragingPort::gradients_handed_one_by_one() const { return im_.shard.stage2() && im_.shard.bucket_view(); }
void* AveragingPort::grad_ptr(std::size_t i) const { return im_.shard.grad_ptr(i); }

comm::AgreementRecord AveragingPort::enter(GateCall call, std::string operation) {
  return optim::enter(im_, call, std::move(operation));
}
void AveragingPort::attach(int world_rank, std::function<void(const Error&)> relay) {
  im_.gate.averagers.emplace_back(this, std::move(relay));
  im_.gate.averaging_world_rank = world_rank;
}
void AveragingPort::detach() noexcept {
  auto& averagers = im_.gate.averagers;
  for (auto it = averagers.begin(); it != averagers.end(); ++it) {
    if (it->first == this) {
      averagers.erase(it);
      return;
    }
  }
}
void AveragingPort::wait_for_queued_work() { im_.overlap.wait_all(); }

void AveragingPort::publish_shard_values(int threads) {
  const ShardState& shard = im_.shard;
  const DType dt = shard.dtype();
  if (dt != DType::f32) {
    const float* master = shard.state_data(kMaster);
    for (const partition::Segment& s : shard.own_shard().segments) {
      if (s.length == 0) continue;
      kernels::narrow_cpu(master + s.shard_offset,
                          element(shard.param_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dt), dt,
                          s.length, threads);
    }
  }
  im_.sync.sync();
}

}  // namespace optim
}  // namespace shardopt
