// src/averaging/post_local_sgd.cpp — PostLocalSGDOptimizer: gradients averaged over the world in warmup and within the replica after it, then the step and the averager.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "averaging/post_local_sgd_impl.hpp"
#include "averaging/span_collectives.hpp"
#include "comm/agreement.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"

namespace shardopt {

struct PostLocalSGDOptimizer::Impl {
  Impl(std::shared_ptr<Communicator> world, ZeroOptimizer& opt, AveragerConfig config)
      : optimizer(opt), averager(std::move(world), opt, std::move(config)) {
    avg().warmup_gradients_cross = true;
  }

  ZeroOptimizer& optimizer;
  ModelAverager averager;
  std::string load_warning;
  std::vector<char> hand_copy;  // warmup's copy of a handed gradient, kept between calls

  ModelAverager::Impl& avg() { return *averager.impl_; }
  bool in_warmup() const { return averager.step() < averager.config().warmup_steps; }
  // Gradients cross the replicas only in warmup, and only when there are several.
  Communicator* warmup_peers() {
    Communicator& peers = *avg().groups.world_peers;
    return in_warmup() && peers.size() > 1 ? &peers : nullptr;
  }
  optim::AveragingPort& port() { return avg().port; }
  int64_t element_bytes() { return static_cast<int64_t>(dtype_size(port().dtype())); }
  // Elements of one warmup collective (the optimizer's bucket_bytes).
  int64_t bucket_elements() { return std::max<int64_t>(16, port().config().bucket_bytes / element_bytes()); }
  // The replica's own reduction hands every trainable gradient once when it has several ranks.
  void count_replica_reduction() {
    if (port().replica_size() > 1) avg().counts.gradient_bytes += port().trainable_numel() * element_bytes();
  }
  // Warmup's agreement across the replicas; a Join refusal carried into it goes on to the
  // replica and the other averaging groups before it is raised (join_refusal_relay.cpp).
  void agree_across_replicas(Communicator& peers, const comm::AgreementRecord& record) {
    try {
      comm::agree(peers, record);
    } catch (const Error& e) {
      avg().relay_join_refusal(e, {&peers});
      throw;
    }
  }
};

namespace {

// Warmup averages gradients across the replicas with collectives on the caller's thread, while
// an overlapped optimizer (config.overlap) runs its bucket reductions of the same gradients on
// its communication thread: two threads in MPI at once (it promises MPI_THREAD_SERIALIZED only)
// and an in-place all-reduce of memory the other is reading. Refused before anything is built,
// by name on every rank of the world (the agreement carries one rank's refusal to all).
void refuse_overlapped_warmup(const std::shared_ptr<Communicator>& world, ZeroOptimizer& optimizer,
                              const AveragerConfig& config) {
  SHARDOPT_CHECK(world != nullptr, invalid_argument, "PostLocalSGDOptimizer: the world communicator is null");
  comm::AgreementRecord record =
      optim::AveragingPort(optimizer).enter(optim::GateCall::attach_averager, "PostLocalSGDOptimizer");
  record.validate([&] {
    const OverlapPolicy overlap = optimizer.config().overlap;
    const int replica = optim::AveragingPort(optimizer).replica_size();
    const bool gradients_cross = config.warmup_steps > 0 && world->size() > replica;
    SHARDOPT_CHECK(overlap == OverlapPolicy::off || !gradients_cross, unsupported,
                   "PostLocalSGDOptimizer with an optimizer whose config.overlap is {}: post-local SGD's warmup "
                   "({} steps) averages gradients across {} replicas on the caller's thread while the overlap's "
                   "communication thread reduces them; build the optimizer with overlap off (or use warmup_steps 0)",
                   overlap_policy_name(overlap), config.warmup_steps, world->size() / std::max(1, replica));
  });
  comm::agree(*world, record);
}

}  // namespace

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::shared_ptr<Communicator> world, ZeroOptimizer& optimizer,
                                             AveragerConfig averager)
    : impl_((refuse_overlapped_warmup(world, optimizer, averager),
             std::make_unique<Impl>(std::move(world), optimizer, std::move(averager)))) {}

PostLocalSGDOptimizer::~PostLocalSGDOptimizer() = default;

void PostLocalSGDOptimizer::reduce_gradients() {
  Impl& im = *impl_;
  optim::AveragingPort& port = im.port();
  im.avg().retake_stale_anchor();  // before per_bucket's updates may move any parameter
  Communicator* peers = im.warmup_peers();
  // Stage-2 bucket view took its gradients through reduce_gradient(), averaged there already.
  if (peers != nullptr && !port.gradients_handed_one_by_one()) {
    std::vector<averaging::HostSpan> spans;
    // Which gradients cross, in which order: replicas whose trainable flags differ (set_trainable
    // is collective within a replica only) would otherwise sum unrelated gradients, or issue
    // all-reduces of different sizes.
    uint64_t handed = comm::fnv1a("");
    int64_t elements = 0;
    for (std::size_t i = 0; i < port.params().size(); ++i) {
      const optim::ParamRecord& p = port.params()[i];
      if (!p.trainable || p.numel == 0) continue;
      spans.push_back(averaging::HostSpan{port.grad_ptr(i), p.numel});
      handed = comm::fnv1a(fmt::format("{}:{};", p.name, p.numel), handed);
      elements += p.numel;
    }
    comm::AgreementRecord record =
        port.enter(optim::GateCall::average_gradients, "PostLocalSGDOptimizer::reduce_gradients");
    record.field("averager step", fmt::format("{}", im.averager.step()));
    record.field("gradients averaged across the replicas (names and sizes, in order)",
                 fmt::format("{} parameters, {} elements of {}, hash {:#018x}", spans.size(), elements,
                             dtype_name(port.dtype()), handed));
    im.agree_across_replicas(*peers, record);
    im.avg().counts.gradient_bytes +=
        averaging::all_reduce_spans(*peers, spans, port.dtype(), im.bucket_elements(), ReduceOp::avg);
  }
  im.optimizer.reduce_gradients();
  im.count_replica_reduction();
}

void PostLocalSGDOptimizer::reduce_gradient(ParamId id, const TensorRef& grad) {
  Impl& im = *impl_;
  im.avg().retake_stale_anchor();  // the round's first hand-over comes before any update
  Communicator* peers = im.warmup_peers();
  if (peers == nullptr) {
    im.optimizer.reduce_gradient(id, grad);
    return;
  }
  // The ranks agree on the parameter before its gradient crosses the replicas: ranks handing
  // parameters in different orders would average different parameters of equal size, or
  // all-reduce different sizes; a bad gradient on one rank fails every rank.
  comm::AgreementRecord record =
      im.port().enter(optim::GateCall::average_gradients, "PostLocalSGDOptimizer::reduce_gradient");
  record.field("averager step", fmt::format("{}", im.averager.step()));
  std::string handed = "none (invalid)";
  record.validate([&] {
    const optim::ParamRecord& p = im.port().param(id);
    SHARDOPT_CHECK(grad.data != nullptr && grad.numel == p.numel && grad.dtype == p.dtype && grad.device.is_cpu(),
                   invalid_argument,
                   "reduce_gradient('{}'): expected {} {} elements on cpu, got {} {} elements at {} on {}", p.name,
                   p.numel, dtype_name(p.dtype), grad.numel, dtype_name(grad.dtype), grad.data,
                   device_name(grad.device));
    handed = fmt::format("'{}' ({} {} elements)", p.name, p.numel, dtype_name(p.dtype));
  });
  record.field("parameter", handed);
  im.agree_across_replicas(*peers, record);
  // The caller's gradient is read-only: average a copy across the replicas, then hand that.
  std::vector<char>& copy = im.hand_copy;
  copy.resize(grad.nbytes());
  std::memcpy(copy.data(), grad.data, copy.size());
  // Reduced in place, so a failed all-reduce hands the copy to the abandoned-memory registry
  // (the next call starts a new one).
  im.avg().counts.gradient_bytes += comm::run_keeping_on_failure(copy, [&] {
    return averaging::all_reduce_spans(*peers, {averaging::HostSpan{copy.data(), grad.numel}}, grad.dtype,
                                       im.bucket_elements(), ReduceOp::avg);
  });
  im.optimizer.reduce_gradient(id, TensorRef{copy.data(), grad.numel, grad.dtype, grad.device});
}

void PostLocalSGDOptimizer::step() {
  impl_->avg().retake_stale_anchor();  // a round whose gradients were handed to the optimizer directly
  impl_->optimizer.step();
  impl_->averager.average_parameters();
}

double PostLocalSGDOptimizer::step(const std::function<double()>& closure) {
  SHARDOPT_CHECK(static_cast<bool>(closure), invalid_argument, "step(closure): the closure is empty");
  const double loss = closure();
  step();
  return loss;
}

void PostLocalSGDOptimizer::save(const std::string& dir) { averaging::save_local_sgd(impl_->avg(), dir); }
void PostLocalSGDOptimizer::load(const std::string& dir) { averaging::load_local_sgd(impl_->avg(), dir); }

void PostLocalSGDOptimizer::consolidate_state_dict(int to) { impl_->optimizer.consolidate_state_dict(to); }

PostLocalSGDStateDict PostLocalSGDOptimizer::state_dict() const {
  PostLocalSGDStateDict dict;
  dict.optimizer = impl_->optimizer.state_dict();
  dict.has_step = true;
  dict.step = impl_->averager.step();
  return dict;
}

void PostLocalSGDOptimizer::load_state_dict(const PostLocalSGDStateDict& state) {
  Impl& im = *impl_;
  // The averager's step decides when the replicas meet: every rank of the world must take the
  // same one, so the world agrees on it before anything changes.
  comm::AgreementRecord record =
      im.port().enter(optim::GateCall::load_state_dict, "PostLocalSGDOptimizer::load_state_dict");
  record.validate([&] {
    SHARDOPT_CHECK(!state.has_step || state.step >= 0, invalid_argument,
                   "load_state_dict: the averager's step must be >= 0, got {}", state.step);
  });
  record.field("averager step", state.has_step ? fmt::format("{}", state.step) : "absent");
  comm::agree(*im.avg().world, record);
  im.optimizer.load_state_dict(state.optimizer);
  im.load_warning.clear();
  if (state.has_step) {
    im.averager.set_step(state.step);
  } else {
    im.load_warning = "Loaded state dict does not contain a step counter for an averager. Setting step counter to 0.";
    im.averager.set_step(0);
  }
}

const std::string& PostLocalSGDOptimizer::load_warning() const { return impl_->load_warning; }
ZeroOptimizer& PostLocalSGDOptimizer::optimizer() { return impl_->optimizer; }
ModelAverager& PostLocalSGDOptimizer::averager() { return impl_->averager; }
Communicator& PostLocalSGDOptimizer::world() const { return *impl_->averager.impl_->world; }

const CommunicationCounts& PostLocalSGDOptimizer::communication() const { return impl_->averager.communication(); }

}  // namespace shardopt
