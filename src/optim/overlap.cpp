// src/optim/overlap.cpp — the overlap engine's rounds: hand-over, bucket order, reductions, per-bucket updates and the all-gathers in forward order.
#include "optim/overlap.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace shardopt {
namespace optim {

OverlapComm overlap_communicator(std::shared_ptr<Communicator> comm, const OptimizerConfig& config) {
  OverlapComm result;
  if (config.overlap == OverlapPolicy::off || comm == nullptr) {
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
}

// Per-bucket broadcasts need each rank's own parameter buffer; node-shared parameters sync
// with the node's barrier instead (then step() syncs them all before it returns).
bool OverlapEngine::gathers_per_bucket() const { return shard_.sharded() && shard_.node_sharing() == nullptr; }

int OverlapEngine::num_buckets() const {
  return static_cast<int>((layout().buffer_numel + bucket_numel() - 1) / bucket_numel());
}

int64_t OverlapEngine::staging_bytes() const {
  int64_t bytes = 0;
  for (const core::FlatBuffer& b : staging_) bytes += b.bytes();
  return bytes;
}

void OverlapEngine::check_can_open() const {
  SHARDOPT_CHECK(!updated_in_round_, invalid_argument,
                 "config.overlap = per_bucket: the last round's buckets were already updated; call step() before "
                 "handing the next round's gradients");
}

void OverlapEngine::open_round(const comm::Agreed& agreed, bool explicit_hand_over) {
  if (learned_layout_ != shard_.layout_version()) {
    learned_.clear();
    learned_layout_ = shard_.layout_version();
  }
  const int n = num_buckets();
  buckets_.assign(static_cast<std::size_t>(n), Bucket{});
  for (int b = 0; b < n; ++b) {
    Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
    bucket.begin = static_cast<int64_t>(b) * bucket_numel();
    bucket.length = std::min(bucket_numel(), layout().buffer_numel - bucket.begin);
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
  const ParamRecord& p = table_.param(id);
  SHARDOPT_CHECK(grad.numel == p.numel && grad.dtype == p.dtype && grad.device == p.device, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has {} elements ({}, {}); the parameter has {} ({}, {})",
                 p.name, grad.numel, dtype_name(grad.dtype), device_name(grad.device), p.numel, dtype_name(p.dtype),
                 device_name(p.device));
  SHARDOPT_CHECK(grad.data != nullptr || p.numel == 0, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has no data", p.name);
  validate_hand(id, "reduce_gradient()");
  if (shard_.stage2()) {
    copy_into_staging(static_cast<std::size_t>(id), grad.data);
  } else {
    dev_.copy_bytes(shard_.grad_ptr(static_cast<std::size_t>(id)), grad.data, span_bytes(p.numel, shard_.dtype()));
  }
  mark(static_cast<std::size_t>(id));
}

void OverlapEngine::ready(ParamId id) {
  validate_hand(id, "grad_ready()");
  mark(static_cast<std::size_t>(id));
}

void OverlapEngine::hand_zeros() { complete_missing(/*zero_in_place=*/true); }

// Hands every param not handed yet: zeros at stage 2; at stage 1 the gradient in place, zeroed
// first with `zero_in_place`.
void OverlapEngine::complete_missing(bool zero_in_place) {
  const std::vector<ParamRecord>& params = table_.params();
  int64_t largest = 0;
  for (const ParamRecord& p : params) largest = std::max(largest, p.trainable ? p.numel : 0);
  const core::FlatBuffer zeros = dev_.new_buffer(shard_.stage2() ? largest : 0, shard_.dtype());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable || handed_[i]) continue;
    if (shard_.stage2()) {
      copy_into_staging(i, zeros.raw());
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
    if (b.missing == 0) completed_.push_back(index);
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
      return static_cast<int>(i);
    }
  }
  staging_.push_back(dev_.new_buffer(std::min(bucket_numel(), layout().buffer_numel), shard_.dtype()));
  staging_busy_.push_back(true);
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
  const int64_t begin = b.begin;
  const int64_t length = b.length;
  // The buffer itself, not its place in staging_, which may grow while the thread reads it.
  const char* staged =
      b.slot >= 0 ? static_cast<const char*>(staging_[static_cast<std::size_t>(b.slot)].raw()) : nullptr;
  const bool has_trainable = b.trainable > 0;
  std::shared_ptr<comm::Ticket> ticket = thread_->submit(
      [this, begin, length, staged, has_trainable, op] { run_bucket(begin, length, staged, has_trainable, op); });
  reductions_[static_cast<std::size_t>(bucket)] = ticket;
  if (per_bucket()) gathers_[static_cast<std::size_t>(bucket)] = ticket;
}

// On the communication thread: the bucket's reduction (the plain path's collectives and
// average), and with per_bucket its update and all-gather.
void OverlapEngine::run_bucket(int64_t begin, int64_t length, const char* staged, bool has_trainable, ReduceOp op) {
  const DType dt = shard_.dtype();
  const partition::RankShard& own = shard_.own_shard();
  const int64_t own_lo = std::max(begin, own.offset);
  const int64_t own_hi = std::min(begin + length, own.offset + own.numel);
  if (!shard_.stage2()) {
    if (dev_.world() > 1) {
      dev_.comm().all_reduce(shard_.flat_grads().at(begin), length, dt, op);
      dev_.finish_gradient_average(shard_.flat_grads().at(begin), length, dt);
    }
  } else if (has_trainable) {
    for (int r = 0; r < dev_.world(); ++r) {
      const partition::RankShard& shard = layout().shards[static_cast<std::size_t>(r)];
      const int64_t lo = std::max(begin, shard.offset);
      const int64_t hi = std::min(begin + length, shard.offset + shard.numel);
      if (lo >= hi) continue;
      void* into = r == dev_.rank() ? static_cast<void*>(shard_.shard_grads().at(lo - shard.offset)) : nullptr;
      if (dev_.world() == 1) {
        dev_.copy_bytes(into, element(staged, lo - begin, dt), span_bytes(hi - lo, dt));
      } else {
        dev_.comm().reduce(element(staged, lo - begin, dt), into, hi - lo, dt, op, r);
      }
    }
    if (own_lo < own_hi) dev_.finish_gradient_average(shard_.shard_grads().at(own_lo - own.offset), own_hi - own_lo, dt);
  }
  if (!per_bucket()) return;
  if (own_lo < own_hi) step_.update_part(own_lo - own.offset, own_hi - own.offset);
  if (gathers_per_bucket()) gather_bucket(begin, length);
}

// Every rank's piece of positions [begin, begin + length), broadcast from its owner.
void OverlapEngine::gather_bucket(int64_t begin, int64_t length) {
  const DType dt = shard_.dtype();
  for (int r = 0; r < dev_.world(); ++r) {
    const partition::RankShard& shard = layout().shards[static_cast<std::size_t>(r)];
    const int64_t lo = std::max(begin, shard.offset);
    const int64_t hi = std::min(begin + length, shard.offset + shard.numel);
    if (lo < hi) dev_.comm().broadcast(shard_.flat_params().at(lo), hi - lo, dt, r);
  }
}

std::vector<int> OverlapEngine::forward_order() const {
  std::vector<int> order = learned_;
  if (order.empty()) {
    for (int b = 0; b < num_buckets(); ++b) order.push_back(b);
  }
  std::reverse(order.begin(), order.end());
  return order;
}

// Step's update driver: the update (unless per_bucket did it on the thread), then the
// all-gathers in forward order, left in flight for wait_param.
void OverlapEngine::update_and_gather(const std::function<void(int64_t, int64_t)>& update) {
  if (updated_in_round_) {
    updated_in_round_ = false;
    std::vector<std::shared_ptr<comm::Ticket>> pending = reductions_;
    reductions_.clear();
    wait_tickets(pending);
  } else {
    update(0, shard_.own_shard().numel);
    if (gathers_per_bucket()) {
      gathers_.assign(static_cast<std::size_t>(num_buckets()), nullptr);
      for (int b : forward_order()) {
        const int64_t begin = static_cast<int64_t>(b) * bucket_numel();
        const int64_t length = std::min(bucket_numel(), layout().buffer_numel - begin);
        gathers_[static_cast<std::size_t>(b)] = thread_->submit([this, begin, length] { gather_bucket(begin, length); });
      }
      return;
    }
  }
  // Node-shared parameters (a barrier per node) or replicated state: synced before returning.
  sync_.sync();
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
  RoundEnd end;
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable || handed_[i]) continue;
    // Stage 1 without any hand-over reads the gradients where they are, as without overlap.
    if ((explicit_ || shard_.stage2()) && !end.failure) {
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

void OverlapEngine::check_no_open_round(const char* what) const {
  SHARDOPT_CHECK(!open_, invalid_argument,
                 "{}: gradients were handed with grad_ready()/reduce_gradient() but the round was not finished "
                 "with reduce_gradients()",
                 what);
}

void OverlapEngine::wait_bucket(int bucket) {
  SHARDOPT_CHECK(bucket >= 0 && bucket < num_buckets(), invalid_argument,
                 "wait_bucket: bucket {} is out of range (this layout has {} buckets)", bucket, num_buckets());
  if (!enabled() || static_cast<std::size_t>(bucket) >= gathers_.size()) return;
  const std::shared_ptr<comm::Ticket> ticket = gathers_[static_cast<std::size_t>(bucket)];
  if (ticket) ticket->wait();
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
  thread_->drain();
  wait_tickets(gathers_);
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
}

}  // namespace optim
}  // namespace shardopt
