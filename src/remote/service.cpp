// src/remote/service.cpp — the owner's service loop: one request at a time, so each owner applies contexts one after another (torch's per-owner serialisation), in arrival or deterministic order.
#include "remote/service.hpp"

#include <algorithm>
#include <cstring>

#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace remote {
namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr double kHousekeepingSeconds = 0.05;
constexpr double kTightWaitSeconds = 1e-3;
constexpr double kIdleSeconds = 200e-6;  // no request this long: the loop sums logged pushes, else sleeps

}  // namespace

Service::Service(MPI_Comm comm, const Directory& directory, OwnerStore& store, const RemoteOptions& options)
    : comm_(comm), directory_(directory), store_(store), options_(options), messages_(options.push_log_bytes) {
  for (int t : directory.trainers()) trainers_[t];
  thread_ = std::thread([this] { run(); });
}

Service::~Service() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void Service::join() {
  if (thread_.joinable()) thread_.join();
}

void Service::stop() { stop_.store(true); }

RemoteStats Service::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

// Idle, the loop probes with sleeps that back off from 20 us to 1 ms (comm::poll_until's
// schedule): Open MPI's blocking probe would poll a core at full speed instead. Busy, it probes
// again at once.
void Service::run() {
  using std::chrono::microseconds;
  microseconds sleep{0};
  Clock::time_point idle_since = Clock::now();
  Clock::time_point last_housekeeping = Clock::now();
  while (!stop_.load()) {
    bool worked = false;
    try {
      worked = receive_one();
    } catch (...) {
      worked = true;  // a request that could not be received is dropped; its trainer times out
    }
    if (seconds_since(last_housekeeping) > kHousekeepingSeconds) {
      housekeeping();
      last_housekeeping = Clock::now();
      if (all_trainers_done() && replies_.empty()) break;
    }
    if (worked) {
      sleep = microseconds{0};
      idle_since = Clock::now();
      continue;
    }
    // Idle (no request for kIdleSeconds): sum one logged push, then probe again. A stream of
    // pushes with shorter gaps is left to arrive at receive speed; its sums wait for a pause
    // or the step.
    if (seconds_since(idle_since) >= kIdleSeconds && fold_while_idle()) {
      sleep = microseconds{0};
      continue;
    }
    if (seconds_since(idle_since) < kIdleSeconds) {
      std::this_thread::yield();
      continue;
    }
    sleep = sleep.count() == 0 ? microseconds{20} : std::min(sleep * 2, microseconds{1000});
    std::this_thread::sleep_for(sleep);
  }
  update_memory_stats();
  // Replies still in flight when the owner stops: MPI may read them until they complete.
  for (Reply& r : replies_) {
    int done = 0;
    MPI_Test(&r.request, &done, MPI_STATUS_IGNORE);
    if (!done) abandon(std::move(r.bytes));
  }
  replies_.clear();
}

bool Service::receive_one() {
  int flag = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  if (MPI_Improbe(MPI_ANY_SOURCE, kRequestTag, comm_, &flag, &message, &status) != MPI_SUCCESS || !flag) return false;
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  if (scratch_.size() < static_cast<std::size_t>(bytes)) scratch_.resize(static_cast<std::size_t>(bytes));
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Imrecv(scratch_.data(), bytes, MPI_BYTE, &message, &request) != MPI_SUCCESS) return true;
  const auto arrived = [&] {
    int done = 0;
    return MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0;
  };
  // A matched message is normally moving: test without yielding the core for a moment (a
  // yield on a busy machine can cost a time slice per message), then wait as the watchdog does.
  bool received = false;
  const Clock::time_point matched = Clock::now();
  while (!received && seconds_since(matched) < kTightWaitSeconds) received = arrived();
  if (!received) received = comm::poll_until(comm::Deadline(options_.timeout_seconds), arrived);
  if (!received) {
    // The sender stopped half way (it died): MPI keeps the buffer; so do we.
    abandon(std::move(scratch_));
    scratch_.clear();
    auto found = trainers_.find(status.MPI_SOURCE);
    if (found != trainers_.end()) found->second.last_heard = Clock::now() - std::chrono::hours(24);
    return true;
  }
  std::lock_guard<std::mutex> lock(store_mutex_);
  handle(status.MPI_SOURCE, scratch_.data(), static_cast<std::size_t>(bytes));
  return true;
}

void Service::handle(int source, const char* data, std::size_t bytes) {
  if (bytes < sizeof(RequestHeader)) return;
  RequestHeader h;
  std::memcpy(&h, data, sizeof(h));
  const char* payload = data + sizeof(RequestHeader);
  const std::size_t payload_bytes = bytes - sizeof(RequestHeader);
  auto trainer = trainers_.find(source);
  if (trainer != trainers_.end()) {
    trainer->second.last_heard = Clock::now();
    if (!deterministic()) trainer->second.gone = false;  // arrival: a silent trainer is back
  }
  switch (h.kind) {
    case RequestKind::push_dense:
    case RequestKind::push_rows: handle_push(source, h, payload, payload_bytes); break;
    case RequestKind::step: handle_step(source, h, payload, payload_bytes); break;
    case RequestKind::pull:
    case RequestKind::pull_rows: handle_pull(source, h, payload, payload_bytes); break;
    case RequestKind::finish:
      if (trainer != trainers_.end()) {
        trainer->second.finished = true;
        trainer->second.steps_total = h.sequence;
        drop_trainer_contexts(source);
        drain_deterministic();
      }
      break;
  }
}

void Service::handle_push(int source, const RequestHeader& h, const char* payload, std::size_t bytes) {
  auto& trainer = trainers_[source];
  if (trainer.gone || trainer.expired.count(h.context) != 0) return;  // its context is gone: the step says so
  OwnerContext& context = contexts_[{source, h.context}];
  context.last_activity = Clock::now();
  if (context.error_code != 0) return;
  try {
    const DirectoryParam* p = h.param >= 0 && static_cast<std::size_t>(h.param) < directory_.size()
                                  ? &directory_.param(h.param)
                                  : nullptr;
    SHARDOPT_CHECK(p != nullptr && h.count >= 0, invalid_argument, "a push names parameter id {}, which is unknown",
                   h.param);
    const int64_t* rows = nullptr;
    if (h.kind == RequestKind::push_dense) {
      SHARDOPT_CHECK(bytes == static_cast<std::size_t>(h.count) * sizeof(float), invalid_argument,
                     "a push of {} elements of '{}' carried {} bytes", h.count, p->name, bytes);
    } else {
      const std::size_t index_bytes = static_cast<std::size_t>(h.count) * sizeof(int64_t);
      SHARDOPT_CHECK(bytes == index_bytes + static_cast<std::size_t>(h.count * p->row_size) * sizeof(float),
                     invalid_argument, "a push of {} rows of '{}' carried {} bytes", h.count, p->name, bytes);
      rows = reinterpret_cast<const int64_t*>(payload);
    }
    store_.check_push(h, rows);  // a bad push is refused now, as if summed on arrival
    // The message itself is logged (its buffer swapped for a pooled one, no copy) and summed
    // later, in arrival order: the sum is the same, and the push is absorbed at receive speed.
    scratch_.resize(sizeof(RequestHeader) + bytes);  // within its capacity: the message alone
    context.log.append(std::move(scratch_), &messages_);
    scratch_ = messages_.take();
    if (context.log.bytes() > options_.push_log_bytes) fold_all(context);  // bounded memory
  } catch (const Error& e) {
    refuse(context, h, e);
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.pushes_received;
    stats_.bytes_received += static_cast<int64_t>(bytes);
  }
}

void Service::refuse(OwnerContext& context, const RequestHeader& h, const Error& e) {
  context.error_code = static_cast<int32_t>(e.code());
  context.error = fmt::format("push {} of the context: {}", h.request_id, e.what());
  context.sums.clear();
  context.log.clear();
}

void Service::fold_one(OwnerContext& context) {
  const std::vector<char>& message = context.log.front();
  RequestHeader h;
  std::memcpy(&h, message.data(), sizeof(h));
  const char* payload = message.data() + sizeof(RequestHeader);
  try {
    if (h.kind == RequestKind::push_dense) {
      store_.add_dense(context, h, reinterpret_cast<const float*>(payload));
    } else {
      store_.add_rows(context, h, reinterpret_cast<const int64_t*>(payload),
                      reinterpret_cast<const float*>(payload + h.count * static_cast<int64_t>(sizeof(int64_t))));
    }
  } catch (const Error& e) {  // e.g. the sum's allocation: the context is refused, as on arrival
    refuse(context, h, e);
    return;
  }
  context.log.pop_front();
}

void Service::fold_all(OwnerContext& context) {
  while (!context.log.empty()) fold_one(context);
}

bool Service::fold_while_idle() {
  std::lock_guard<std::mutex> lock(store_mutex_);
  for (auto& entry : contexts_) {
    if (entry.second.log.empty()) continue;
    fold_one(entry.second);  // one push, then the loop probes for requests again
    return true;
  }
  return false;
}

void Service::handle_step(int source, const RequestHeader& h, const char* payload, std::size_t bytes) {
  PendingStep step;
  step.header = h;
  if (bytes != static_cast<std::size_t>(h.count) * sizeof(int32_t)) {
    reply(source, h.request_id, static_cast<int>(ErrorCode::internal), "a malformed step request");
    return;
  }
  step.touched.resize(static_cast<std::size_t>(h.count));
  if (bytes > 0) std::memcpy(step.touched.data(), payload, bytes);  // a step of no ids sends no payload (null)
  auto found = contexts_.find({source, h.context});
  if (found != contexts_.end()) found->second.stepped = true;
  if (!deterministic()) {
    apply_step(source, step);
    return;
  }
  TrainerState& trainer = trainers_[source];
  if (trainer.gone) {
    reply(source, h.request_id, static_cast<int>(ErrorCode::timeout),
          fmt::format("trainer rank {} left the deterministic order after {} s of silence; its step {} is refused",
                      source, options_.context_expiry_seconds, h.sequence));
    return;
  }
  trainer.waiting[h.sequence] = std::move(step);
  drain_deterministic();
}

void Service::apply_step(int source, const PendingStep& step) {
  const RequestHeader& h = step.header;
  const auto key = std::make_pair(source, h.context);
  auto found = contexts_.find(key);
  TrainerState& trainer = trainers_[source];
  trainer.last_heard = Clock::now();  // it waited on this step: its silence starts with the answer
  if (trainer.expired.count(h.context) != 0) {
    reply(source, h.request_id, static_cast<int>(ErrorCode::invalid_argument),
          fmt::format("context {} expired on this owner after {} s without a push", h.context,
                      options_.context_expiry_seconds));
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.contexts_failed;
    return;
  }
  if (found != contexts_.end()) fold_all(found->second);  // what is still logged, in arrival order
  if (found != contexts_.end() && found->second.error_code != 0) {
    reply(source, h.request_id, found->second.error_code, found->second.error);
    contexts_.erase(found);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.contexts_failed;
    return;
  }
  try {
    store_.apply(found != contexts_.end() ? &found->second : nullptr, step.touched.data(),
                 static_cast<int64_t>(step.touched.size()));
  } catch (const Error& e) {  // e.g. an allocation for the update: the trainer hears it by name
    if (found != contexts_.end()) contexts_.erase(found);
    reply(source, h.request_id, static_cast<int>(e.code()), e.what());
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.contexts_failed;
    return;
  }
  if (found != contexts_.end()) contexts_.erase(found);
  reply(source, h.request_id, 0, "");
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.contexts_applied;
}

// Applies the waiting steps whose turn has come: the live trainer with the fewest steps applied
// here (ties: the lowest rank) goes next, once its next step has arrived.
void Service::drain_deterministic() {
  if (!deterministic()) return;
  for (;;) {
    int next = -1;
    for (auto& [rank, t] : trainers_) {
      if (t.gone || (t.finished && t.applied >= t.steps_total)) continue;
      if (next < 0 || t.applied < trainers_[next].applied) next = rank;
    }
    if (next < 0) return;
    TrainerState& t = trainers_[next];
    const auto waiting = t.waiting.find(t.applied);
    if (waiting == t.waiting.end()) return;
    const PendingStep step = std::move(waiting->second);
    t.waiting.erase(waiting);
    ++t.applied;
    apply_step(next, step);
  }
}

void Service::handle_pull(int source, const RequestHeader& h, const char* payload, std::size_t bytes) {
  try {
    const OwnedSlice* s = store_.slice(h.param);
    SHARDOPT_CHECK(s != nullptr && h.count >= 0, invalid_argument, "pull: parameter id {} has no rows here", h.param);
    std::vector<float> out;
    if (h.kind == RequestKind::pull) {
      out.resize(static_cast<std::size_t>(h.count));
      store_.read(h.param, h.offset, h.count, out.data());
    } else {
      SHARDOPT_CHECK(bytes == static_cast<std::size_t>(h.count) * sizeof(int64_t), invalid_argument,
                     "pull_rows: {} rows carried {} bytes", h.count, bytes);
      out.resize(static_cast<std::size_t>(h.count * s->row_size));
      store_.read_rows(h.param, reinterpret_cast<const int64_t*>(payload), h.count, out.data());
    }
    reply(source, h.request_id, 0, "", out.data(), out.size() * sizeof(float));
  } catch (const Error& e) {
    reply(source, h.request_id, static_cast<int>(e.code()), e.what());
  }
}

void Service::reply(int dest, int64_t request_id, int code, const std::string& message, const void* data,
                    std::size_t bytes) {
  ReplyHeader header;
  header.request_id = request_id;
  header.code = code;
  header.message_length = static_cast<int32_t>(std::min(message.size(), kMessageBytes));
  std::memcpy(header.message, message.data(), static_cast<std::size_t>(header.message_length));
  replies_.emplace_back();
  Reply& r = replies_.back();
  r.bytes.resize(sizeof(ReplyHeader) + bytes);
  std::memcpy(r.bytes.data(), &header, sizeof(header));
  if (bytes > 0) std::memcpy(r.bytes.data() + sizeof(header), data, bytes);
  if (MPI_Isend(r.bytes.data(), static_cast<int>(r.bytes.size()), MPI_BYTE, dest, reply_tag(request_id), comm_,
                &r.request) != MPI_SUCCESS) {
    replies_.pop_back();  // the trainer is unreachable: it times out
  }
}

int64_t Service::drop_trainer_contexts(int trainer) {
  int64_t dropped = 0;
  for (auto it = contexts_.begin(); it != contexts_.end();) {
    if (it->first.first == trainer && !it->second.stepped) {
      it = contexts_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

void Service::housekeeping() {
  // Replies: forget the completed ones; one a silent trainer never took is kept until exit.
  for (auto it = replies_.begin(); it != replies_.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    if (done) {
      it = replies_.erase(it);
    } else if (seconds_since(it->sent) > options_.context_expiry_seconds) {
      abandon(std::move(it->bytes));
      it = replies_.erase(it);
    } else {
      ++it;
    }
  }
  int64_t expired = 0;
  for (auto it = contexts_.begin(); it != contexts_.end();) {
    if (!it->second.stepped && seconds_since(it->second.last_activity) > options_.context_expiry_seconds) {
      TrainerState& t = trainers_[it->first.first];
      t.expired.insert(it->first.second);
      if (t.expired.size() > 4096) t.expired.erase(t.expired.begin());  // bounded; old ids only
      it = contexts_.erase(it);
      ++expired;
    } else {
      ++it;
    }
  }
  int64_t gone = 0;
  for (auto& [rank, t] : trainers_) {
    // A trainer whose step waits here for its turn is waiting on us, not silent.
    if (t.gone || t.finished || !t.waiting.empty() || seconds_since(t.last_heard) <= options_.context_expiry_seconds) {
      continue;
    }
    t.gone = true;
    t.waiting.clear();
    expired += drop_trainer_contexts(rank);  // a silent trainer's open contexts expire with it
    ++gone;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.contexts_expired += expired;
    stats_.trainers_gone += gone;
  }
  if (gone > 0) drain_deterministic();
  update_memory_stats();
}

void Service::update_memory_stats() {
  int64_t bytes = 0, logged = 0;
  for (const auto& c : contexts_) {
    bytes += c.second.bytes();
    logged += c.second.log.bytes();
  }
  // The pool changes on this thread alone (contexts end here), so it is read without the store's lock.
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.open_contexts = static_cast<int64_t>(contexts_.size());
  stats_.accumulator_bytes = bytes;
  stats_.logged_bytes = logged;
  stats_.pooled_bytes = store_.pooled_bytes() + messages_.bytes();
}

bool Service::all_trainers_done() const {
  for (const auto& [rank, t] : trainers_) {
    if (t.gone) continue;
    if (!t.finished) return false;
    if (deterministic() && t.applied < t.steps_total) return false;
  }
  return true;
}

}  // namespace remote
}  // namespace shardopt
