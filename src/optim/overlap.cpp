// src/optim/overlap.cpp — the overlap engine's rounds: hand-over, staging, bucket order and issue, the round's close and the waits (the work per bucket: overlap_work.cpp).
#include "optim/overlap.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace shardopt {
namespace optim {

OverlapComm overlap_communicator(std::shared_ptr<Communicator> comm, const OptimizerConfig& config) {
  OverlapComm result;
  // A stream-ordered communicator (NCCL) only enqueues: the device progresses its collectives
  // while the caller computes, with no thread needed to keep its calls in order.
  if (config.overlap == OverlapPolicy::off || comm == nullptr ||
      (comm->device().is_cuda() && comm->cuda_stream() != nullptr)) {
    result.comm = std::move(comm);
    return result;
  }
  try {
    comm::require_serialized_calls(*comm);
  } catch (const Error& e) {
    result.comm = std::move(comm);
    result.refused = e;
    return result;
  }
  result.thread = std::make_shared<comm::CommThread>();
  result.comm = comm::serialize_on(std::move(comm), result.thread);
  return result;
}

OverlapEngine::OverlapEngine(std::shared_ptr<comm::CommThread> thread, const DeviceContext& dev,
                             const OptimizerConfig& config, const ParamTable& table, ShardState& shard,
                             ParamSync& sync, Step& step)
    : thread_(std::move(thread)), dev_(dev), config_(config), table_(table), shard_(shard), sync_(sync), step_(step) {
  if (!enabled()) return;
  step_.set_update_driver([this](const std::function<void(int64_t, int64_t)>& update) { update_and_gather(update); });
}

OverlapEngine::~OverlapEngine() {
  if (thread_) thread_->drain();
  destroy_events();
}

void OverlapEngine::check_device_path() const {
  if (!enabled() || !dev_.on_device() || dev_.world() == 1 || dev_.stream_ordered()) return;
  raise(ErrorCode::unsupported,
        "config.overlap = {} with parameters on {} over {} ranks needs a communicator that runs its collectives "
        "on a CUDA stream (nccl_world() or nccl_borrow()); the '{}' communicator takes device buffers on the "
        "host's timeline, so every bucket would make the host wait for the device (rank {})",
        overlap_policy_name(config_.overlap), device_name(dev_.device()), dev_.world(), dev_.comm().backend_name(),
        dev_.rank());
}

std::shared_ptr<comm::Ticket> OverlapEngine::submit(std::function<void()> work) {
  if (runs_inline()) return comm::CommThread::run_here(work);
  return thread_->submit(std::move(work));
}

int64_t OverlapEngine::bucket_length(int bucket) const {
  return std::min(bucket_numel(), layout().buffer_numel - bucket_begin(bucket));
}

void* OverlapEngine::event_at(const std::vector<void*>& events, int index) {
  return static_cast<std::size_t>(index) < events.size() ? events[static_cast<std::size_t>(index)] : nullptr;
}

// Created once per layout, so that steps create none.
void OverlapEngine::ensure_events() {
  if (!dev_.on_device() || !dev_.stream_ordered()) return;
  const std::size_t n = static_cast<std::size_t>(num_buckets());
  if (reduced_events_.size() == n) return;
  destroy_events();
  for (std::size_t b = 0; b < n; ++b) {
    reduced_events_.push_back(dev_.create_event());
    gathered_events_.push_back(dev_.create_event());
  }
}

void OverlapEngine::destroy_events() noexcept {
  for (std::vector<void*>* events : {&reduced_events_, &gathered_events_, &staging_events_}) {
    for (void* e : *events) dev_.destroy_event(e);
    events->clear();
  }
}

// Per-bucket broadcasts need each rank's own parameter buffer; node-shared parameters sync
// with the node's barrier instead (then step() syncs them all before it returns).
bool OverlapEngine::gathers_per_bucket() const { return shard_.sharded() && shard_.node_sharing() == nullptr; }

int OverlapEngine::num_buckets() const {
  // At most kMaxBuckets (check_bucket_count at registration): fits an int.
  return static_cast<int>((layout().buffer_numel + bucket_numel() - 1) / bucket_numel());
}

int64_t OverlapEngine::staging_bytes() const {
  int64_t bytes = 0;
  for (const core::FlatBuffer& b : staging_) bytes += b.bytes();
  return bytes;
}

void OverlapEngine::open_round(const comm::Agreed& agreed, bool explicit_hand_over) {
  const device::ScopedDevice scope(dev_.device());
  ensure_events();
  if (learned_layout_ != shard_.layout_version()) {
    learned_.clear();
    learned_layout_ = shard_.layout_version();
  }
  const int n = num_buckets();
  buckets_.assign(static_cast<std::size_t>(n), Bucket{});
  for (int b = 0; b < n; ++b) {
    Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
    bucket.begin = bucket_begin(b);
    bucket.length = bucket_length(b);
  }
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable) continue;
    const int64_t lo = layout().param_offset[i];
    for (int64_t pos = lo; pos < lo + params[i].numel;) {
      Bucket& b = buckets_[static_cast<std::size_t>(pos / bucket_numel())];
      const int64_t end = std::min(lo + params[i].numel, b.begin + b.length);
      b.trainable += end - pos;
      pos = end;
    }
  }
  completed_.clear();
  for (int b = 0; b < n; ++b) {
    Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
    bucket.missing = bucket.trainable;
    if (bucket.missing == 0) completed_.push_back(b);  // padding only: complete from the start
  }
  handed_.assign(params.size(), false);
  reductions_.assign(static_cast<std::size_t>(n), nullptr);
  gathers_.resize(static_cast<std::size_t>(n));
  next_issue_ = 0;
  explicit_ = explicit_hand_over;
  deferred_ = agreed.active() < dev_.world();
  open_ = true;
  // per_bucket updates on the thread: the state they write must exist first.
  if (per_bucket()) shard_.ensure_state_kinds();
  if (slots() != nullptr) {
    count_slot_round();
    for (int b : completed_) hand_over_slot_bucket(b);  // padding only
  }
  try_issue();
}

void OverlapEngine::validate_hand(ParamId id, const char* call) const {
  const ParamRecord& p = table_.param(id);
  SHARDOPT_CHECK(p.trainable, invalid_argument, "{}: parameter '{}' is frozen", call, p.name);
  SHARDOPT_CHECK(!handed_[static_cast<std::size_t>(id)], invalid_argument,
                 "{}: the gradient of '{}' was already handed in this round (call reduce_gradients() to finish a "
                 "round before the next)",
                 call, p.name);
}

void OverlapEngine::hand(ParamId id, const TensorRef& grad) {
  const device::ScopedDevice scope(dev_.device());
  const ParamRecord& p = table_.param(id);
  SHARDOPT_CHECK(grad.numel == p.numel && grad.dtype == p.dtype && grad.device == p.device, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has {} elements ({}, {}); the parameter has {} ({}, {})",
                 p.name, grad.numel, dtype_name(grad.dtype), device_name(grad.device), p.numel, dtype_name(p.dtype),
                 device_name(p.device));
  SHARDOPT_CHECK(grad.data != nullptr || p.numel == 0, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has no data", p.name);
  validate_hand(id, "reduce_gradient()");
  if (shard_.stage2() && slots() == nullptr) {
    copy_into_staging(static_cast<std::size_t>(id), grad.data);
  } else {
    // Into grad_view(id) (stage 2 on one node: this rank's slot), unless it was written there.
    void* into = shard_.grad_ptr(static_cast<std::size_t>(id));
    if (into != grad.data) dev_.copy_bytes(into, grad.data, span_bytes(p.numel, shard_.dtype()));
  }
  mark(static_cast<std::size_t>(id));
}

void OverlapEngine::ready(ParamId id) {
  const device::ScopedDevice scope(dev_.device());
  validate_hand(id, "grad_ready()");
  mark(static_cast<std::size_t>(id));
}

void OverlapEngine::hand_zeros() {
  const device::ScopedDevice scope(dev_.device());
  complete_missing(/*zero_in_place=*/true);
}

// Hands every param not handed yet: zeros at stage 2; at stage 1 the gradient in place, zeroed
// first with `zero_in_place`.
void OverlapEngine::complete_missing(bool zero_in_place) {
  const std::vector<ParamRecord>& params = table_.params();
  int64_t largest = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].trainable && !handed_[i]) largest = std::max(largest, params[i].numel);
  }
  // Allocated once per layout (reset() drops it), and only once a param is missing: a rank in
  // join() hands zeros every round, on a device without allocating.
  // On the slots stage 2 keeps whole gradients as stage 1 does.
  const bool staged = shard_.stage2() && slots() == nullptr;
  if (staged && zeros_.numel() < largest) zeros_ = dev_.new_buffer(largest, shard_.dtype());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable || handed_[i]) continue;
    if (staged) {
      copy_into_staging(i, zeros_.raw());
    } else if (zero_in_place) {
      dev_.zero_bytes(shard_.grad_ptr(i), span_bytes(params[i].numel, shard_.dtype()));
    }
    mark(i);
  }
}

void OverlapEngine::mark(std::size_t param) {
  const ParamRecord& p = table_.params()[param];
  const int64_t lo = layout().param_offset[param];
  for (int64_t pos = lo; pos < lo + p.numel;) {
    const int index = static_cast<int>(pos / bucket_numel());
    Bucket& b = buckets_[static_cast<std::size_t>(index)];
    const int64_t end = std::min(lo + p.numel, b.begin + b.length);
    b.missing -= end - pos;
    pos = end;
    if (b.missing != 0) continue;
    completed_.push_back(index);
    // On the slots a complete bucket is handed over at once, whatever the order.
    if (slots() != nullptr) hand_over_slot_bucket(index);
  }
  handed_[param] = true;
  try_issue();
}

// Stage 2 keeps no whole gradient: each bucket is assembled in a staging buffer of its own
// until it is reduced to its owners.
void OverlapEngine::copy_into_staging(std::size_t param, const void* grad) {
  const ParamRecord& p = table_.params()[param];
  const DType dt = shard_.dtype();
  const int64_t lo = layout().param_offset[param];
  for (int64_t pos = lo; pos < lo + p.numel;) {
    Bucket& b = buckets_[static_cast<std::size_t>(pos / bucket_numel())];
    const int64_t end = std::min(lo + p.numel, b.begin + b.length);
    if (b.slot < 0) b.slot = acquire_staging();
    dev_.copy_bytes(staging_[static_cast<std::size_t>(b.slot)].at(pos - b.begin), element(grad, pos - lo, dt),
                    span_bytes(end - pos, dt));
    pos = end;
  }
}

int OverlapEngine::acquire_staging() {
  // Two buffers in flight bound the memory as the plain reduction does, where a reduction is
  // in flight to wait for; buckets held for the order (or Join) take more.
  constexpr std::size_t kStagingKept = 3;
  reclaim_staging(staging_.size() >= kStagingKept);
  for (std::size_t i = 0; i < staging_busy_.size(); ++i) {
    if (!staging_busy_[i]) {
      staging_busy_[i] = true;
      // On a device the host let the buffer go once its reduction was enqueued: the copies
      // that refill it wait (on the device) for that reduction to have read it.
      dev_.compute_waits(event_at(staging_events_, static_cast<int>(i)));
      return static_cast<int>(i);
    }
  }
  staging_.push_back(dev_.new_buffer(std::min(bucket_numel(), layout().buffer_numel), shard_.dtype()));
  staging_busy_.push_back(true);
  if (dev_.on_device() && dev_.stream_ordered()) staging_events_.push_back(dev_.create_event());
  return static_cast<int>(staging_.size()) - 1;
}

// Frees the staging of reduced buckets; with `wait_for_one`, waits for the oldest reduction in
// flight when none has finished.
void OverlapEngine::reclaim_staging(bool wait_for_one) {
  int oldest = -1;
  bool freed = false;
  const auto release = [&](Bucket& b) {
    staging_busy_[static_cast<std::size_t>(b.slot)] = false;
    b.slot = -1;
    freed = true;
  };
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (b.slot < 0 || !b.issued) continue;
    if (reductions_[k]->done()) {
      release(b);
    } else if (oldest < 0) {
      oldest = static_cast<int>(k);
    }
  }
  if (freed || !wait_for_one || oldest < 0) return;
  // Its failure is raised by whoever waits for the round; here it only frees the buffer.
  try {
    reductions_[static_cast<std::size_t>(oldest)]->wait();
  } catch (const Error&) {
  }
  release(buckets_[static_cast<std::size_t>(oldest)]);
}

// With the order learned, a bucket goes as soon as it and all buckets before it are complete.
void OverlapEngine::try_issue() {
  if (!open_ || deferred_ || learned_.empty()) return;
  while (next_issue_ < learned_.size()) {
    const int b = learned_[next_issue_];
    if (buckets_[static_cast<std::size_t>(b)].missing != 0) return;
    issue(b);
    ++next_issue_;
  }
}

void OverlapEngine::issue(int bucket) {
  Bucket& b = buckets_[static_cast<std::size_t>(bucket)];
  if (b.issued) return;
  b.issued = true;
  const ReduceOp op = dev_.gradient_average_op();
  // The buffer itself, not its place in staging_, which may grow while the thread reads it.
  const char* staged =
      b.slot >= 0 ? static_cast<const char*>(staging_[static_cast<std::size_t>(b.slot)].raw()) : nullptr;
  void* staged_event = b.slot >= 0 ? event_at(staging_events_, b.slot) : nullptr;
  const bool has_trainable = b.trainable > 0;
  std::shared_ptr<comm::Ticket> ticket;
  if (slots() != nullptr) {
    ticket = submit([this, bucket, target = slot_target()] { run_bucket_on_slots(bucket, target); });
  } else {
    ticket = submit([this, bucket, staged, staged_event, has_trainable, op] {
      run_bucket(bucket, staged, staged_event, has_trainable, op);
    });
  }
  reductions_[static_cast<std::size_t>(bucket)] = ticket;
  if (per_bucket()) gathers_[static_cast<std::size_t>(bucket)] = ticket;
}

void OverlapEngine::wait_tickets(std::vector<std::shared_ptr<comm::Ticket>>& tickets) {
  std::exception_ptr first;
  for (std::shared_ptr<comm::Ticket>& t : tickets) {
    if (!t) continue;
    try {
      t->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

OverlapEngine::RoundEnd OverlapEngine::close_hand_over() {
  const device::ScopedDevice scope(dev_.device());
  RoundEnd end;
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable || handed_[i]) continue;
    // Stage 1 (and stage 2 on the slots) without any hand-over reads the gradients where they
    // are, as without overlap.
    if ((explicit_ || (shard_.stage2() && slots() == nullptr)) && !end.failure) {
      end.failure = Error(ErrorCode::invalid_argument,
                          fmt::format("reduce_gradients(): rank {} never handed the gradient of '{}' with {} in "
                                      "this round (every trainable parameter must be handed, on every rank)",
                                      dev_.rank(), params[i].name,
                                      shard_.stage2() ? "reduce_gradient()" : "grad_ready() or reduce_gradient()"));
    }
  }
  // Zeros (stage 2) or the values in place (stage 1), so that this rank still issues every
  // bucket's collectives as its peers do.
  complete_missing(/*zero_in_place=*/false);
  end.order = "buckets completed in the order ";
  for (std::size_t k = 0; k < completed_.size(); ++k) end.order += (k ? "," : "") + std::to_string(completed_[k]);
  return end;
}

void OverlapEngine::settle_round() {
  const device::ScopedDevice scope(dev_.device());
  if (deferred_) {
    // A rank in join() follows the active ranks' calls one agreement behind: every rank
    // issues this round's buckets after the order check, in position order.
    for (int b = 0; b < num_buckets(); ++b) issue(b);
  } else if (learned_.empty()) {
    if (explicit_) {
      learned_ = completed_;
      learned_layout_ = shard_.layout_version();
    } else {
      for (int b = 0; b < num_buckets(); ++b) issue(b);  // no hand-over order to learn from
    }
  }
  try_issue();
  if (per_bucket()) {
    updated_in_round_ = true;  // step() waits for the updates
  } else {
    std::vector<std::shared_ptr<comm::Ticket>> pending = reductions_;
    wait_tickets(pending);
    // On the slots: every rank's sums are in (and no rank reads this rank's slot any more).
    if (slots() != nullptr) wait_slots_reduced();
    // On a device: the statistics, clipping and update that follow read the averages.
    dev_.compute_waits_for_collectives();
  }
  end_round();
}

void OverlapEngine::end_round() {
  open_ = false;
  for (Bucket& b : buckets_) {
    if (b.slot >= 0) staging_busy_[static_cast<std::size_t>(b.slot)] = false;
  }
  buckets_.clear();
  handed_.clear();
  completed_.clear();
  if (!updated_in_round_) reductions_.clear();
}

void OverlapEngine::abandon_round() noexcept {
  if (thread_) thread_->drain();
  updated_in_round_ = false;
  end_round();
}

void OverlapEngine::wait_bucket(int bucket) {
  SHARDOPT_CHECK(bucket >= 0 && bucket < num_buckets(), invalid_argument,
                 "wait_bucket: bucket {} is out of range (this layout has {} buckets)", bucket, num_buckets());
  if (!enabled() || static_cast<std::size_t>(bucket) >= gathers_.size()) return;
  const std::shared_ptr<comm::Ticket> ticket = gathers_[static_cast<std::size_t>(bucket)];
  if (!ticket) return;
  ticket->wait();
  if (!gathers_per_bucket()) return;  // (then step() synced the parameters)
  const device::ScopedDevice scope(dev_.device());
  dev_.compute_waits(event_at(gathered_events_, bucket));
}

void OverlapEngine::wait_param(ParamId id) {
  const ParamRecord& p = table_.param(id);  // range check
  if (!enabled() || !p.trainable || p.numel == 0) return;
  const int64_t lo = layout().param_offset[static_cast<std::size_t>(id)];
  const int first = static_cast<int>(lo / bucket_numel());
  const int last = static_cast<int>((lo + p.numel - 1) / bucket_numel());
  for (int b = first; b <= last; ++b) wait_bucket(b);
}

void OverlapEngine::wait_all() {
  if (!enabled()) return;
  if (thread_) thread_->drain();
  wait_tickets(gathers_);
  const device::ScopedDevice scope(dev_.device());
  dev_.compute_waits_for_collectives();
}

void OverlapEngine::reset() {
  if (thread_) thread_->drain();
  updated_in_round_ = false;
  end_round();
  reductions_.clear();
  gathers_.clear();
  learned_.clear();
  staging_.clear();
  staging_busy_.clear();
  zeros_ = core::FlatBuffer();
  destroy_events();
}

}  // namespace optim
}  // namespace shardopt
