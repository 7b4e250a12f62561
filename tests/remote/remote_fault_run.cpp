// tests/remote/remote_fault_run.cpp — a remote optimizer's owner or trainer is SIGKILLed mid-run; every survivor must end with what the contract promises, printing one FAULT-RESULT line.
//
//   remote_fault_run owner|trainer arrival|deterministic
//
// owner: owners are ranks 0 and 1 (the embedding split over both), trainers ranks 1..n-1; rank 0
// kills itself after 1 s. Each trainer steps until a call fails: it must be Error(timeout)
// naming owner rank 0, within the timeout (3 s) plus slack of its last good call.
// trainer: rank 0 owns everything, ranks 1..n-1 train; the last rank opens a context, pushes
// into it and kills itself. The other trainers step for 4 s (the expiry is 1.5 s): every step
// must succeed. The owner must then count the dead trainer gone and its context expired, hold
// no accumulator, and return from close().
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "shardopt/shardopt.hpp"

using namespace shardopt;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void result(int rank, bool ok, double seconds, const std::string& what) {
  std::printf("FAULT-RESULT rank=%d ok=%d seconds=%.2f what=%s\n", rank, ok ? 1 : 0, seconds, what.c_str());
  std::fflush(stdout);
}

std::vector<RemoteGroupSpec> groups(int rank, int64_t rows, int64_t row_size, const std::vector<int>& owners) {
  std::vector<RemoteGroupSpec> out;
  for (std::size_t k = 0; k < owners.size(); ++k) {
    if (owners[k] != rank) continue;
    RemoteGroupSpec g;
    g.algorithm = Algorithm::adam;
    const int64_t n = static_cast<int64_t>(owners.size());
    g.params.push_back({"emb", rows, row_size, rows * static_cast<int64_t>(k) / n, rows * static_cast<int64_t>(k + 1) / n,
                        nullptr});
    out.push_back(g);
  }
  return out;
}

void one_step(RemoteOptimizer& remote, const RemoteParam& emb, int k) {
  const RemoteContext c = remote.open_context();
  std::vector<int64_t> rows = {k % emb.rows, (k * 7 + 3) % emb.rows, emb.rows - 1};
  std::vector<float> values(rows.size() * static_cast<std::size_t>(emb.row_size), 0.01f);
  remote.push_rows(c, emb, rows.data(), static_cast<int64_t>(rows.size()), values.data());
  remote.step(c);
}

std::string fmt_steps(int steps, const std::string& failure) {
  return "trainer: " + std::to_string(steps) + " steps" + (failure.empty() ? "" : ", then: " + failure);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "owner";
  const std::string order = argc > 2 ? argv[2] : "arrival";
  CommOptions comm_options;
  comm_options.timeout_seconds = 3;
  auto comm = remote_mpi_world(comm_options);
  const int rank = comm->rank();
  const int n = comm->size();
  RemoteOptions options;
  options.order = order == "deterministic" ? RemoteOrder::deterministic : RemoteOrder::arrival;
  options.timeout_seconds = 3;
  options.context_expiry_seconds = 1.5;
  const std::vector<int> owners = scenario == "owner" ? std::vector<int>{0, 1} : std::vector<int>{0};
  options.trainer = rank >= 1;
  RemoteOptimizer remote(comm, groups(rank, 64, 8, owners), options);
  const RemoteParam emb = remote.lookup("emb");

  if (scenario == "owner") {
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      raise(SIGKILL);
    }
    Clock::time_point last_good = Clock::now();
    const Clock::time_point start = Clock::now();
    for (int k = 0;; ++k) {
      try {
        one_step(remote, emb, k);
        last_good = Clock::now();
      } catch (const Error& e) {
        const double seconds = since(last_good);
        const std::string what = e.what();
        const bool ok = e.code() == ErrorCode::timeout && what.find("owner rank 0") != std::string::npos &&
                        seconds < options.timeout_seconds + 2.0;
        result(rank, ok, seconds, what);
        break;
      }
      if (since(start) > 20) {
        result(rank, false, since(start), "no error 20 s after the owner was killed");
        break;
      }
    }
    try {
      remote.close();
    } catch (const Error&) {
      // close() tells the dead owner too: its timeout is expected here
    }
    return 0;
  }

  // scenario == "trainer"
  const int victim = n - 1;
  if (rank == victim) {
    const RemoteContext c = remote.open_context();
    std::vector<float> grad(static_cast<std::size_t>(emb.numel()), 1.f);
    remote.push(c, emb, grad.data(), emb.numel());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGKILL);
  }
  const Clock::time_point start = Clock::now();
  if (rank != 0) {
    int steps = 0;
    std::string failure;
    while (since(start) < 4.0) {
      try {
        one_step(remote, emb, steps);
        ++steps;
      } catch (const Error& e) {
        failure = e.what();
        break;
      }
    }
    result(rank, failure.empty() && steps > 0, since(start), fmt_steps(steps, failure));
    remote.close();
    return 0;
  }
  remote.close();  // serves until the live trainers finished and the dead one went silent
  const RemoteStats s = remote.stats();
  const bool ok = s.trainers_gone == 1 && s.contexts_expired >= 1 && s.open_contexts == 0 && s.accumulator_bytes == 0 &&
                  s.contexts_applied > 0;
  char what[256];
  std::snprintf(what, sizeof(what),
                "owner: trainers_gone=%lld contexts_expired=%lld open_contexts=%lld accumulator_bytes=%lld "
                "contexts_applied=%lld",
                static_cast<long long>(s.trainers_gone), static_cast<long long>(s.contexts_expired),
                static_cast<long long>(s.open_contexts), static_cast<long long>(s.accumulator_bytes),
                static_cast<long long>(s.contexts_applied));
  result(rank, ok, since(start), what);
  return 0;
}
