// src/averaging/model_averager.cpp — ModelAverager: the construction's agreement and checks, and average_parameters() (plain average or outer step).
#include <optional>

#include <fmt/format.h>

#include "averaging/averaging_schedule.hpp"
#include "averaging/model_averager_impl.hpp"
#include "averaging/span_collectives.hpp"
#include "comm/agreement.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "cpu/update_cpu.hpp"

namespace shardopt {

using comm::AgreementRecord;

namespace {

// What every rank of the world must agree on about its replica's optimizer: replicas that
// registered different models would "average" unrelated values.
void add_replica_fields(const optim::AveragingPort& port, AgreementRecord& record) {
  const OptimizerConfig& config = port.config();
  record.field("replica algorithm", algorithm_name(config.algorithm));
  record.field("replica dtype", dtype_name(port.dtype()));
  record.field("replica storage", config.storage == Storage::bucket_view ? "bucket_view" : "external");
  record.field("replica sharding", config.shard_state ? partition_name(config.partition) : "replicated");
  record.field("replica parameters", fmt::format("{}", port.params().size()));
  uint64_t hash = comm::fnv1a("");
  for (const optim::ParamRecord& p : port.params()) {
    hash = comm::fnv1a(fmt::format("{}:{}:{};", p.name, p.numel, p.trainable ? 't' : 'f'), hash);
  }
  record.field("replica parameter names, sizes and trainable flags", fmt::format("hash {:#018x}", hash));
}

void add_config_fields(const AveragerConfig& config, AgreementRecord& record) {
  std::string levels;
  for (const AveragingLevel& l : config.levels) levels += fmt::format("{}:{} ", l.period, l.group_size);
  record.field("levels (period:group size)", levels);
  record.field("warmup_steps", fmt::format("{}", config.warmup_steps));
  record.field("hierarchical", config.hierarchical ? "true" : "false");
  record.field("bucket_bytes", fmt::format("{}", config.bucket_bytes));
  record.field("outer optimizer", config.outer.enabled ? fmt::format("lr {} momentum {} nesterov {}", config.outer.lr,
                                                                     config.outer.momentum, config.outer.nesterov)
                                                       : "off");
}

// One agreement over the level's whole group, built of three over its parts: the replica, the
// partners of this shard (one rank of each replica of the group), the replica again. A failure
// on any rank of the group (a mismatch, a Join refusal carried in) so reaches every rank of it,
// never leaving a replica's ranks in the sync below waiting for a partner that raised. A Join
// refusal goes on to the other averaging groups before it is raised.
void agree_over_level_group(ModelAverager::Impl& im, AgreementRecord& record, Communicator& peers) {
  optim::AveragingPort& port = im.port;
  std::optional<Error> failure;
  try {
    comm::agree(port.replica(), record);
  } catch (const Error& e) {
    failure = e;
  }
  const bool replica_raised = failure.has_value();
  record.field("shard elements", fmt::format("{}", port.own_shard().numel));
  if (peers.size() > 1) {
    if (failure) record.fail(*failure);
    try {
      comm::agree(peers, record);
    } catch (const Error& e) {
      if (!failure) failure = e;
    }
    // Every rank of the replica raised together above, or none did and each now tells the others
    // what its partners said.
    if (!replica_raised && port.replica_size() > 1) {
      AgreementRecord partners(record.operation());
      if (failure) partners.fail(*failure);
      try {
        comm::agree(port.replica(), partners);
      } catch (const Error& e) {
        if (!failure) failure = e;
      }
    }
  }
  if (!failure) return;
  im.relay_join_refusal(*failure, {&port.replica(), &peers});
  throw *failure;
}

}  // namespace

void ModelAverager::Impl::take_anchor() {
  const int64_t numel = port.own_shard().numel;
  outer.anchor.assign(static_cast<std::size_t>(numel), 0.f);
  outer.momentum.assign(static_cast<std::size_t>(numel), 0.f);
  outer.steps = 0;
  outer.values_generation = port.values_generation();
  outer.provisional = false;
  for (const optim::ValueSpan& s : port.shard_values()) {
    std::copy(s.data, s.data + s.count, outer.anchor.begin() + s.shard_offset);
  }
}

bool ModelAverager::Impl::anchor_replaced() { return outer.values_generation != port.values_generation(); }

void ModelAverager::Impl::retake_stale_anchor() {
  if (!config.outer.enabled || !(outer.provisional || anchor_replaced())) return;
  // The last step's queued all-gathers (config.overlap) land first; they never write this
  // rank's own shard, but the anchor is read whole.
  port.wait_for_queued_work();
  take_anchor();
}

ModelAverager::ModelAverager(std::shared_ptr<Communicator> world, ZeroOptimizer& optimizer, AveragerConfig config)
    : impl_(std::make_unique<Impl>(world, optimizer)) {
  SHARDOPT_CHECK(world != nullptr, invalid_argument, "ModelAverager: the world communicator is null");
  Impl& im = *impl_;
  optim::AveragingPort& port = im.port;
  Communicator& replica = port.replica();
  // The agreement comes first, before any collective on the replica: a rank whose arguments
  // failed joins it (or never arrives), so the others fail here instead of waiting in a
  // replica collective that rank will never join.
  AgreementRecord record = port.enter(optim::GateCall::attach_averager, "ModelAverager");
  record.validate([&] {
    im.config = averaging::validated_config(config, world->size());
    SHARDOPT_CHECK(!port.on_device(), unsupported,
                   "ModelAverager: the optimizer's parameters are on {}; model averaging runs on CPU parameters only",
                   device_name(port.device()));
    SHARDOPT_CHECK(!port.masters_in_remainders(), unsupported,
                   "ModelAverager: a param group of the optimizer keeps master = remainder16; model averaging "
                   "averages fp32 masters, so build the optimizer with master = fp32");
  });
  add_config_fields(config, record);
  add_replica_fields(port, record);
  record.set_payload(0, static_cast<uint64_t>(replica.size()));
  record.set_payload(1, static_cast<uint64_t>(replica.rank()));
  const std::vector<comm::Payload> payloads = comm::agree(*world, record);
  // The world rank of the replica's first rank identifies the replica.
  // (Through heap memory of their own: a collective that times out may write it later.)
  int32_t leader = world->rank();
  comm::broadcast_record(replica, leader, 0);
  const std::vector<int32_t> leaders = comm::all_gather_records(*world, leader);
  std::vector<averaging::RankPlace> places;
  for (std::size_t r = 0; r < payloads.size(); ++r) {
    places.push_back(averaging::RankPlace{static_cast<int>(payloads[r][0]), static_cast<int>(payloads[r][1]),
                                          static_cast<int>(leaders[r])});
  }
  // Every rank holds the same list, so every rank raises the same error, or none does.
  im.groups = averaging::make_replica_groups(*world, places, im.config);
  // Provisional: the caller may still write the model's weights through the views.
  if (im.config.outer.enabled) {
    im.take_anchor();
    im.outer.provisional = true;
  }
  // A Join refusal raised out of the optimizer's agreements (all of them on the replica) goes on
  // to the averaging groups (join_refusal_relay.cpp).
  Impl* relaying = &im;
  port.attach(world->rank(), [relaying](const Error& e) {
    relaying->relay_join_refusal(e, {&relaying->port.replica()});
  });
}

ModelAverager::~ModelAverager() { impl_->port.detach(); }

void ModelAverager::average_parameters() {
  Impl& im = *impl_;
  optim::AveragingPort& port = im.port;
  const int level = averaging::level_at(im.config, im.step);
  if (level >= 0) {
    const bool outer_step = im.config.outer.enabled && level + 1 == static_cast<int>(im.config.levels.size());
    // The values were replaced (a load, a state dict, a layout change) after the local phase
    // began, and nobody retook the anchor then: the drift from it means nothing. The outer
    // optimizer restarts from this average instead (plain averaging this once).
    const bool outer_restart = outer_step && im.anchor_replaced();
    Communicator& peers = *im.groups.level_peers[static_cast<std::size_t>(level)];
    // The replica's ranks, then the partners of this shard, agree on the step, the outer
    // optimizer's state and the layout.
    // The gate: a background save done reading the values averaged below, the last step's
    // all-gathers (config.overlap) landed, and no gradient round open.
    AgreementRecord record = port.enter(optim::GateCall::average_parameters, "average_parameters");
    record.field("averager step", fmt::format("{}", im.step));
    if (outer_step) {
      record.field("outer optimizer", outer_restart ? std::string("restarting (parameters replaced since its anchor)")
                                                    : fmt::format("{} steps taken", im.outer.steps));
    }
    agree_over_level_group(im, record, peers);

    const std::vector<optim::ValueSpan> values = port.shard_values();
    std::vector<averaging::HostSpan> spans;
    for (const optim::ValueSpan& v : values) spans.push_back(averaging::HostSpan{v.data, v.count});
    const int threads = im.optimizer.config().cpu_threads;
    const float replicas = static_cast<float>(peers.size());
    // torch's average_parameters: each value divided by the group's size, then summed.
    im.counts.averaging_bytes += averaging::all_reduce_spans(
        peers, spans, DType::f32, std::max<int64_t>(16, im.config.bucket_bytes / 4), ReduceOp::sum,
        [&](void* data, int64_t n) { kernels::divide_cpu(data, DType::f32, n, replicas, threads); });
    if (outer_restart) {
      im.take_anchor();
    } else if (outer_step) {
      const OuterOptimizer& o = im.config.outer;
      const kernels::SgdScalars scalars =
          kernels::make_sgd_scalars(o.lr, o.momentum, 0.0, 0.0, o.nesterov, false, im.outer.steps == 0);
      std::vector<float> pseudo_grad;
      for (const optim::ValueSpan& v : values) {
        float* anchor = im.outer.anchor.data() + v.shard_offset;
        pseudo_grad.resize(static_cast<std::size_t>(v.count));
        for (int64_t i = 0; i < v.count; ++i) pseudo_grad[static_cast<std::size_t>(i)] = anchor[i] - v.data[i];
        kernels::sgd_update_cpu(anchor, pseudo_grad.data(), im.outer.momentum.data() + v.shard_offset, v.count,
                                scalars, threads);
        std::copy(anchor, anchor + v.count, v.data);
      }
      ++im.outer.steps;
    }
    port.publish_shard_values(threads);
    ++im.counts.averages;
  }
  ++im.step;
  // The outer optimizer measures the replicas' drift from where the local phase starts.
  if (im.config.outer.enabled && im.step == im.config.warmup_steps) im.take_anchor();
}

int ModelAverager::next_group_size() const {
  const int level = averaging::level_at(impl_->config, impl_->step);
  return level < 0 ? 0 : impl_->config.levels[static_cast<std::size_t>(level)].group_size;
}

int64_t ModelAverager::step() const { return impl_->step; }

void ModelAverager::set_step(int64_t step) {
  SHARDOPT_CHECK(step >= 0, invalid_argument, "ModelAverager::set_step: the step must be >= 0, got {}", step);
  Impl& im = *impl_;
  im.step = step;
  // A new schedule position (a resume, or a jump past warmup): the local phase starts from the
  // parameters as they are, or as PostLocalSGDOptimizer finds them when its next round begins
  // (the caller may write the weights after this call).
  if (im.config.outer.enabled) {
    im.take_anchor();
    im.outer.provisional = true;
  }
}

const AveragerConfig& ModelAverager::config() const { return impl_->config; }
const CommunicationCounts& ModelAverager::communication() const { return impl_->counts; }
int ModelAverager::replica_size() const { return impl_->groups.replica_size; }
int ModelAverager::num_replicas() const { return impl_->groups.num_replicas; }

}  // namespace shardopt
