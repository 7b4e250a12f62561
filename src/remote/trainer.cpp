// src/remote/trainer.cpp — the trainer's calls: validated before anything is sent (so a refused call changes nothing), then nonblocking sends to each owner of the rows involved.
#include "remote/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/mpi/mpi_runtime.hpp"
#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "remote/staging.hpp"

namespace shardopt {
namespace remote {

void Exchange::expect_reply(int owner, int64_t request_id, std::size_t data_bytes, MPI_Comm comm) {
  buffers.emplace_back(sizeof(ReplyHeader) + data_bytes);
  replies.push_back(MPI_REQUEST_NULL);
  owners.push_back(owner);
  const int code = MPI_Irecv(buffers.back().data(), static_cast<int>(buffers.back().size()), MPI_BYTE, owner,
                             reply_tag(request_id), comm, &replies.back());
  SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "RemoteOptimizer::{}: receiving owner rank {}'s reply failed: {}", call,
                 owner, comm::mpi_error_string(code));
}

Exchange::~Exchange() {
  for (std::size_t i = 0; i < replies.size(); ++i) {
    int done = 0;
    if (replies[i] != MPI_REQUEST_NULL) MPI_Test(&replies[i], &done, MPI_STATUS_IGNORE);
    if (replies[i] != MPI_REQUEST_NULL) abandon(std::move(buffers[i]));
  }
  for (auto& s : sends) {
    int done = 0;
    if (s && s->request != MPI_REQUEST_NULL) MPI_Test(&s->request, &done, MPI_STATUS_IGNORE);
    if (s && s->request != MPI_REQUEST_NULL) abandon(std::move(s));
  }
}

namespace {

// comm::poll_until's schedule (a 200 us spin that yields, then sleeps doubling from 20 us to
// 1 ms), except that any progress (`progress()` grew) starts the spin again: a trainer's large
// pushes travel only while it calls MPI (rendezvous), so it must not sleep while they move.
template <typename Done, typename Progress>
bool poll_with_progress(const comm::Deadline& deadline, const Done& done, const Progress& progress) {
  using std::chrono::microseconds;
  std::size_t seen = 0;
  auto quiet_since = comm::WatchdogClock::now();
  microseconds sleep{20};
  for (;;) {
    if (done()) return true;
    if (deadline.seconds() > 0 && deadline.elapsed() > deadline.seconds()) return false;
    const std::size_t now_done = progress();
    if (now_done != seen) {
      seen = now_done;
      quiet_since = comm::WatchdogClock::now();
      sleep = microseconds{20};
    }
    if (std::chrono::duration<double>(comm::WatchdogClock::now() - quiet_since).count() < 200e-6) {
      // Moving: test again soon, but yield first: where cores are fewer than threads, the
      // owner's service thread (on which every push waits) needs the core more than we do.
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, microseconds{1000});
  }
}

constexpr std::size_t kPushesInFlight = 64;

}  // namespace

void Exchange::finish() {
  int failed_code = MPI_SUCCESS;
  int failed_owner = -1;
  std::size_t completed = 0;  // requests seen complete so far: progress resets the backoff
  const auto all_done = [&] {
    completed = 0;
    bool all = true;
    for (auto& s : sends) {
      int done = 0;
      if (s->request == MPI_REQUEST_NULL) {
        ++completed;
        continue;
      }
      const int code = MPI_Test(&s->request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        failed_code = code;
        s->request = MPI_REQUEST_NULL;
      }
      if (!done) all = false;
      completed += done != 0;
    }
    for (std::size_t i = 0; i < replies.size(); ++i) {
      int done = 0;
      if (replies[i] == MPI_REQUEST_NULL) {
        ++completed;
        continue;
      }
      const int code = MPI_Test(&replies[i], &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        failed_code = code;
        failed_owner = owners[i];
        replies[i] = MPI_REQUEST_NULL;
      }
      if (!done) all = false;
      completed += done != 0;
    }
    return all;
  };
  const bool done = poll_with_progress(comm::Deadline(timeout_seconds), all_done, [&] { return completed; });
  if (!done) {
    int silent = -1;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (replies[i] != MPI_REQUEST_NULL) {
        if (silent < 0) silent = owners[i];
        abandon(std::move(buffers[i]));
      }
    }
    for (auto& s : sends) {
      if (s->request != MPI_REQUEST_NULL) {
        if (silent < 0) silent = s->dest;
        abandon(std::move(s));
      }
    }
    raise(ErrorCode::timeout,
          "RemoteOptimizer::{}: owner rank {} did not answer within {} s (it died, or no longer serves: "
          "RemoteOptions.timeout_seconds)",
          call, silent, timeout_seconds);
  }
  SHARDOPT_CHECK(failed_code == MPI_SUCCESS, comm, "RemoteOptimizer::{}: MPI failed talking to owner rank {}: {}", call,
                 failed_owner, comm::mpi_error_string(failed_code));
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    ReplyHeader header;
    std::memcpy(&header, buffers[i].data(), sizeof(header));
    if (header.code != 0) {
      throw Error(static_cast<ErrorCode>(header.code),
                  fmt::format("RemoteOptimizer::{}: owner rank {} refused it: {}", call, owners[i],
                              std::string(header.message, static_cast<std::size_t>(header.message_length))));
    }
  }
}

Trainer::Trainer(MPI_Comm comm, const Directory& directory, const RemoteOptions& options)
    : comm_(comm), directory_(directory), options_(options) {}

RemoteContext Trainer::open_context() {
  std::lock_guard<std::mutex> lock(mutex_);
  SHARDOPT_CHECK(!finished_, invalid_argument, "RemoteOptimizer::open_context: this rank has closed its trainer part");
  SHARDOPT_CHECK(static_cast<int>(open_.size()) < options_.max_open_contexts, invalid_argument,
                 "RemoteOptimizer::open_context: {} contexts are open already (RemoteOptions.max_open_contexts); "
                 "step one first",
                 open_.size());
  const RemoteContext id = next_context_++;
  open_[id];
  return id;
}

Trainer::Context& Trainer::open(RemoteContext context, const char* call) {
  const auto found = open_.find(context);
  if (found != open_.end()) return found->second;
  SHARDOPT_CHECK(context >= 0 && context < next_context_, invalid_argument,
                 "RemoteOptimizer::{}: context {} was never opened on this rank", call, context);
  raise(ErrorCode::invalid_argument, "RemoteOptimizer::{}: context {} was stepped already (or dropped by close())",
        call, context);
}

void Trainer::forget_completed(Context& context) {
  // Sends complete in order per owner, mostly; test the oldest few to keep the list short.
  auto& sends = context.sends;
  std::size_t done_prefix = 0;
  for (auto& s : sends) {
    int done = 0;
    if (s->request != MPI_REQUEST_NULL) MPI_Test(&s->request, &done, MPI_STATUS_IGNORE);
    if (s->request != MPI_REQUEST_NULL) break;
    ++done_prefix;
  }
  sends.erase(sends.begin(), sends.begin() + static_cast<std::ptrdiff_t>(done_prefix));
}

void Trainer::send(Context& context, std::unique_ptr<PendingSend> send,
                   const std::vector<std::pair<const void*, std::size_t>>& spans, int owner, bool pack) {
  const int code = start_send(*send, spans, owner, comm_, pack);
  SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "RemoteOptimizer: sending to owner rank {} failed: {}", owner,
                 comm::mpi_error_string(code));
  context.sends.push_back(std::move(send));
  ++context.pushes;
  forget_completed(context);
  // Flow control: at most kPushesInFlight of this context's pushes travel at once (thousands
  // queued at an owner make MPI's matching crawl, and hold the trainer's memory in MPI's hands).
  if (context.sends.size() >= kPushesInFlight) {
    PendingSend& oldest = *context.sends.front();
    // Every pending send is tested: the trainer's MPI calls are what moves its large pushes, so
    // it spins while any of them progresses.
    std::size_t completed = 0;
    const bool moved = poll_with_progress(
        comm::Deadline(options_.timeout_seconds),
        [&] {
          completed = 0;
          for (auto& pending : context.sends) {
            int done = 0;
            if (pending->request != MPI_REQUEST_NULL) MPI_Test(&pending->request, &done, MPI_STATUS_IGNORE);
            completed += pending->request == MPI_REQUEST_NULL;
          }
          return oldest.request == MPI_REQUEST_NULL;
        },
        [&] { return completed; });
    SHARDOPT_CHECK(moved, timeout,
                   "RemoteOptimizer: a push to owner rank {} did not leave within {} s (it died, or no longer serves: "
                   "RemoteOptions.timeout_seconds)",
                   oldest.dest, options_.timeout_seconds);
    forget_completed(context);
  }
}

void Trainer::push(RemoteContext context, const RemoteParam& param, const float* grad, int64_t numel) {
  std::lock_guard<std::mutex> lock(mutex_);
  const DirectoryParam& p = directory_.checked(param, "push");
  Context& c = open(context, "push");
  SHARDOPT_CHECK(numel == p.rows * p.row_size, invalid_argument,
                 "RemoteOptimizer::push: '{}' has {} elements ({} rows of {}), the gradient {}", p.name,
                 p.rows * p.row_size, p.rows, p.row_size, numel);
  SHARDOPT_CHECK(grad != nullptr, invalid_argument, "RemoteOptimizer::push: the gradient of '{}' is null", p.name);
  // A gradient in CUDA device memory is copied to the host now, and each request packs its part.
  const HostView host(grad, static_cast<std::size_t>(numel) * sizeof(float),
                      fmt::format("the gradient of '{}' pushed", p.name));
  grad = static_cast<const float*>(host.data());
  for (const Slice& s : p.slices) {
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::push_dense;
    request->header.param = param.id;
    request->header.context = context;
    request->header.request_id = c.pushes;
    request->header.offset = s.row_begin * p.row_size;
    request->header.count = (s.row_end - s.row_begin) * p.row_size;
    const float* from = grad + request->header.offset;
    const std::size_t bytes = static_cast<std::size_t>(request->header.count) * sizeof(float);
    send(c, std::move(request), {{from, bytes}}, s.owner, host.copied());
  }
  c.touched.insert(param.id);
}

void Trainer::push_rows(RemoteContext context, const RemoteParam& param, const int64_t* rows, int64_t count,
                        const float* values) {
  std::lock_guard<std::mutex> lock(mutex_);
  const DirectoryParam& p = directory_.checked(param, "push_rows");
  Context& c = open(context, "push_rows");
  SHARDOPT_CHECK(count >= 0, invalid_argument, "RemoteOptimizer::push_rows: negative row count {}", count);
  SHARDOPT_CHECK(count == 0 || (rows != nullptr && values != nullptr), invalid_argument,
                 "RemoteOptimizer::push_rows: null rows or values for '{}'", p.name);
  // Rows or values in CUDA device memory are copied to the host now (the rows are checked
  // here), and each request packs its part.
  const HostView host_rows(rows, static_cast<std::size_t>(count) * sizeof(int64_t),
                           fmt::format("the rows pushed to '{}'", p.name));
  const HostView host_values(values, static_cast<std::size_t>(count * p.row_size) * sizeof(float),
                             fmt::format("the row values pushed to '{}'", p.name));
  rows = static_cast<const int64_t*>(host_rows.data());
  values = static_cast<const float*>(host_values.data());
  const bool pack = host_rows.copied() || host_values.copied();
  for (int64_t i = 0; i < count; ++i) {
    SHARDOPT_CHECK(rows[i] >= 0 && rows[i] < p.rows, invalid_argument,
                   "RemoteOptimizer::push_rows: row {} (index {}) is out of range for '{}', which has {} rows", rows[i],
                   i, p.name, p.rows);
  }
  const std::size_t row_bytes = static_cast<std::size_t>(p.row_size) * sizeof(float);
  for (const Slice& s : p.slices) {
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::push_rows;
    request->header.param = param.id;
    request->header.context = context;
    request->header.request_id = c.pushes;
    if (p.slices.size() == 1) {
      request->header.count = count;
      const std::size_t n = static_cast<std::size_t>(count);
      send(c, std::move(request), {{rows, n * sizeof(int64_t)}, {values, n * row_bytes}}, s.owner, pack);
      continue;
    }
    // Rows of several owners: gather this owner's indices, then its rows, in push order.
    int64_t mine = 0;
    for (int64_t i = 0; i < count; ++i) mine += rows[i] >= s.row_begin && rows[i] < s.row_end;
    if (mine == 0) continue;
    std::vector<char>& packed = request->packed;
    packed.resize(static_cast<std::size_t>(mine) * (sizeof(int64_t) + row_bytes));
    char* index_at = packed.data();
    char* row_at = packed.data() + static_cast<std::size_t>(mine) * sizeof(int64_t);
    for (int64_t i = 0; i < count; ++i) {
      if (rows[i] < s.row_begin || rows[i] >= s.row_end) continue;
      std::memcpy(index_at, &rows[i], sizeof(int64_t));
      std::memcpy(row_at, values + i * p.row_size, row_bytes);
      index_at += sizeof(int64_t);
      row_at += row_bytes;
    }
    request->header.count = mine;
    const void* start = packed.data();
    const std::size_t size = packed.size();
    send(c, std::move(request), {{start, size}}, s.owner, false);  // packed already
  }
  c.touched.insert(param.id);
}

std::unique_ptr<Exchange> Trainer::step(RemoteContext context) {
  std::lock_guard<std::mutex> lock(mutex_);
  Context& c = open(context, "step");
  auto exchange = std::make_unique<Exchange>();
  exchange->call = fmt::format("step(context {})", context);
  exchange->timeout_seconds = options_.timeout_seconds;
  exchange->sends = std::move(c.sends);
  const std::vector<int32_t> touched(c.touched.begin(), c.touched.end());
  const int64_t sequence = steps_issued_++;
  open_.erase(context);
  // Every owner hears of every step (one that holds none of its parameters applies nothing):
  // the deterministic order counts each trainer's steps on every owner.
  for (int owner : directory_.owners()) {
    const int64_t request_id = next_request_++;
    exchange->expect_reply(owner, request_id, 0, comm_);
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::step;
    request->header.context = context;
    request->header.request_id = request_id;
    request->header.sequence = sequence;
    request->header.count = static_cast<int64_t>(touched.size());
    // The ids travel from the request's own copy: MPI may read them after this call returns.
    request->packed.resize(touched.size() * sizeof(int32_t));
    if (!touched.empty()) std::memcpy(request->packed.data(), touched.data(), request->packed.size());
    const int code = start_send(*request, {{request->packed.data(), request->packed.size()}}, owner, comm_);
    SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "RemoteOptimizer::step: sending to owner rank {} failed: {}", owner,
                   comm::mpi_error_string(code));
    exchange->sends.push_back(std::move(request));
  }
  return exchange;
}

void Trainer::pull(const RemoteParam& param, float* out, int64_t numel) {
  std::unique_lock<std::mutex> lock(mutex_);
  const DirectoryParam& p = directory_.checked(param, "pull");
  SHARDOPT_CHECK(numel == p.rows * p.row_size, invalid_argument,
                 "RemoteOptimizer::pull: '{}' has {} elements ({} rows of {}), the output {}", p.name,
                 p.rows * p.row_size, p.rows, p.row_size, numel);
  SHARDOPT_CHECK(out != nullptr, invalid_argument, "RemoteOptimizer::pull: the output for '{}' is null", p.name);
  Exchange exchange;
  exchange.call = fmt::format("pull('{}')", p.name);
  exchange.timeout_seconds = options_.timeout_seconds;
  for (const Slice& s : p.slices) {
    const int64_t request_id = next_request_++;
    const int64_t count = (s.row_end - s.row_begin) * p.row_size;
    exchange.expect_reply(s.owner, request_id, static_cast<std::size_t>(count) * sizeof(float), comm_);
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::pull;
    request->header.param = param.id;
    request->header.request_id = request_id;
    request->header.offset = s.row_begin * p.row_size;
    request->header.count = count;
    const int code = start_send(*request, {}, s.owner, comm_);
    SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "RemoteOptimizer::pull: sending to owner rank {} failed: {}", s.owner,
                   comm::mpi_error_string(code));
    exchange.sends.push_back(std::move(request));
  }
  lock.unlock();
  exchange.finish();
  for (std::size_t i = 0; i < p.slices.size(); ++i) {
    const Slice& s = p.slices[i];
    copy_from_host(out + s.row_begin * p.row_size, exchange.data(i),
                   static_cast<std::size_t>((s.row_end - s.row_begin) * p.row_size) * sizeof(float),
                   fmt::format("the pulled values of '{}'", p.name));
  }
}

void Trainer::pull_rows(const RemoteParam& param, const int64_t* rows, int64_t count, float* out) {
  std::unique_lock<std::mutex> lock(mutex_);
  const DirectoryParam& p = directory_.checked(param, "pull_rows");
  SHARDOPT_CHECK(count >= 0 && (count == 0 || (rows != nullptr && out != nullptr)), invalid_argument,
                 "RemoteOptimizer::pull_rows: bad rows for '{}' (count {}, or a null buffer)", p.name, count);
  const HostView host_rows(rows, static_cast<std::size_t>(count) * sizeof(int64_t),
                           fmt::format("the rows pulled from '{}'", p.name));
  rows = static_cast<const int64_t*>(host_rows.data());
  for (int64_t i = 0; i < count; ++i) {
    SHARDOPT_CHECK(rows[i] >= 0 && rows[i] < p.rows, invalid_argument,
                   "RemoteOptimizer::pull_rows: row {} (index {}) is out of range for '{}', which has {} rows", rows[i],
                   i, p.name, p.rows);
  }
  Exchange exchange;
  exchange.call = fmt::format("pull_rows('{}')", p.name);
  exchange.timeout_seconds = options_.timeout_seconds;
  std::vector<std::vector<int64_t>> positions;  // per slice asked: where its rows go in `out`
  std::vector<std::vector<int64_t>> asked;
  for (const Slice& s : p.slices) {
    std::vector<int64_t> mine, at;
    for (int64_t i = 0; i < count; ++i) {
      if (rows[i] >= s.row_begin && rows[i] < s.row_end) {
        mine.push_back(rows[i]);
        at.push_back(i);
      }
    }
    if (mine.empty()) continue;
    const int64_t request_id = next_request_++;
    exchange.expect_reply(s.owner, request_id, mine.size() * static_cast<std::size_t>(p.row_size) * sizeof(float),
                          comm_);
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::pull_rows;
    request->header.param = param.id;
    request->header.request_id = request_id;
    request->header.count = static_cast<int64_t>(mine.size());
    request->packed.resize(mine.size() * sizeof(int64_t));
    if (!mine.empty()) std::memcpy(request->packed.data(), mine.data(), request->packed.size());
    const int code = start_send(*request, {{request->packed.data(), request->packed.size()}}, s.owner, comm_);
    SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "RemoteOptimizer::pull_rows: sending to owner rank {} failed: {}",
                   s.owner, comm::mpi_error_string(code));
    exchange.sends.push_back(std::move(request));
    positions.push_back(std::move(at));
    asked.push_back(std::move(mine));
  }
  lock.unlock();
  exchange.finish();
  const std::size_t row_bytes = static_cast<std::size_t>(p.row_size) * sizeof(float);
  // Output in CUDA device memory: the rows are placed on the host, then copied in one go.
  std::vector<float> staged;
  float* place = out;
  if (in_device_memory(out)) {
    staged.resize(static_cast<std::size_t>(count * p.row_size));
    place = staged.data();
  }
  for (std::size_t k = 0; k < positions.size(); ++k) {
    for (std::size_t j = 0; j < positions[k].size(); ++j) {
      std::memcpy(place + positions[k][j] * p.row_size, exchange.data(k) + j * row_bytes, row_bytes);
    }
  }
  if (place != out) {
    copy_from_host(out, staged.data(), staged.size() * sizeof(float), fmt::format("the rows pulled from '{}'", p.name));
  }
}

void Trainer::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  Exchange exchange;
  exchange.call = "close()";
  exchange.timeout_seconds = options_.timeout_seconds;
  for (auto& [id, context] : open_) {
    for (auto& s : context.sends) exchange.sends.push_back(std::move(s));
  }
  open_.clear();
  for (int owner : directory_.owners()) {
    auto request = std::make_unique<PendingSend>();
    request->header.kind = RequestKind::finish;
    request->header.sequence = steps_issued_;
    if (start_send(*request, {}, owner, comm_) == MPI_SUCCESS) exchange.sends.push_back(std::move(request));
  }
  lock.unlock();
  exchange.finish();
}

}  // namespace remote
}  // namespace shardopt
