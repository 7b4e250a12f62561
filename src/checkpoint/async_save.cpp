// src/checkpoint/async_save.cpp — the background writer of save_async, its hand-back of the live buffers, and the collective finish.
#include "checkpoint/async_save.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

const char* point_name(WritePoint point) {
  switch (point) {
    case WritePoint::kHalfWritten: return "half-written";
    case WritePoint::kSourcesRead: return "sources-read";
    case WritePoint::kCommitted: return "committed";
  }
  return "unknown";
}

// The crash-safety tests' hook: with SHARDOPT_TEST_PAUSE_ASYNC_SAVE="<point>:<prefix>", the
// writer that reaches <point> writes its process id to the file <prefix>.<rank> and sleeps (up
// to a minute) so that the test can kill the process there.
// A slow filesystem, for the tests that check that steps wait for the writer: with
// SHARDOPT_TEST_SLOW_ASYNC_SAVE_MS=<ms> the writer sleeps that long with half its file written.
void pause_for_test(WritePoint point, int rank) {
  const char* slow = std::getenv("SHARDOPT_TEST_SLOW_ASYNC_SAVE_MS");
  if (slow != nullptr && point == WritePoint::kHalfWritten) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(slow)));
  }
  const char* value = std::getenv("SHARDOPT_TEST_PAUSE_ASYNC_SAVE");
  if (value == nullptr) return;
  const std::string spec = value;
  const std::size_t colon = spec.find(':');
  if (colon == std::string::npos || spec.substr(0, colon) != point_name(point)) return;
  std::ofstream(spec.substr(colon + 1) + "." + std::to_string(rank)) << ::getpid() << "\n";
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace

AsyncSave::~AsyncSave() { abandon(); }

void AsyncSave::start(SaveTicket ticket) {
  SHARDOPT_CHECK(!pending_, internal, "{}: another background save is still pending", ticket.what);
  ticket_ = std::move(ticket);
  written_ = Outcome{};
  sources_read_ = false;
  pending_ = true;
  try {
    writer_ = std::thread([this] { write(); });
  } catch (const std::system_error&) {
    // No thread to be had: write here and now, which is what save() would have done.
    write();
  }
}

void AsyncSave::write() {
  written_ = write_own_shard_file(ticket_, [this](WritePoint point) {
    if (point == WritePoint::kSourcesRead) {
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        sources_read_ = true;
      }
      sources_read_signal_.notify_all();
    }
    pause_for_test(point, ticket_.rank);
  });
}

double AsyncSave::wait_for_sources() {
  if (!pending_) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  sources_read_signal_.wait(lock, [this] { return sources_read_; });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void AsyncSave::finish(Communicator& comm) {
  SHARDOPT_CHECK(pending_, internal, "wait_save: no background save is pending");
  if (writer_.joinable()) writer_.join();
  pending_ = false;
  ticket_.engine.reset();  // its staging memory is not needed until the next save
  finish_save(comm, ticket_, written_);
}

void AsyncSave::abandon() noexcept {
  if (writer_.joinable()) writer_.join();
  if (pending_) abandon_save(ticket_);
  ticket_.engine.reset();
  pending_ = false;
}

}  // namespace checkpoint
}  // namespace shardopt
