// bench/remote/remote_ps_bench.cpp — parameter-server benchmark: an embedding table on 1-2 owners, trainers pushing sparse row gradients through the RemoteOptimizer, against raw MPI send/recv of the same bytes in the same run; validates the table afterwards.
//
//   mpirun -n N shardopt-remote-bench [--rows R] [--dim D] [--owners O] [--batch B] [--pushes P]
//                                     [--repeats K] [--pull] [--no-raw] [--split] [--threads T]
//                                     [--push-log-bytes L]
//
// Ranks 0..O-1 own the table (rows split evenly), the others train. Each repeat runs four phases,
// each started by a barrier and timed on every trainer to its last answer:
//   raw:     every trainer packs each push's bytes (a 48-byte header, B row indices, B rows:
//            what push_rows sends) into one buffer and MPI_Isends it to its owner, 64 in flight
//            at most; the owner MPI_Recvs them all into one buffer (and does nothing with them),
//            then acknowledges. Transport alone.
//   raw+keep: the same, and the owner receives each message into a buffer of its own, all kept
//            until the phase ends (the buffers reused by the next repeat): what any owner that
//            holds pushes until the step writes to memory, as the remote optimizer's push log does.
//   raw+sub: the same, and the owner subtracts each received row from its own copy of its rows
//            (lr 1): the least a hand-written MPI parameter server does with a push.
//   remote:  every trainer opens a context, push_rows P times (B rows of one owner each,
//            alternating owners), then step(context); the owners sum the rows per context in f32
//            and apply SGD to the rows pushed, and answer the step. Timed in two parts: push
//            (the pushes until every owner has received every trainer's: a pull_rows of one row
//            from each owner, answered after the pushes before it, then the trainers wait for
//            each other) and step (the rest, the owners' sums and update).
// With --pull every push is preceded by pull_rows of its rows (a parameter server's pull,
// compute, push; compare with bench/remote/remote_ps_torch_rpc.py), and the raw phase is skipped.
// Prints pushes/s and GB/s per phase (the best repeat of each), push/raw and push/raw+keep (the
// push part against raw and raw+keep), the step's seconds, remote/raw and remote/raw+sub (push+step, the whole cost). Afterwards the first
// trainer pulls the whole table and checks every element against the pushes' exact sum
// (values are multiples of 1/64 and lr is 1, so every sum is exact in f32).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/shardopt.hpp"

using namespace shardopt;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int64_t rows = 2'000'000;
  int64_t dim = 16;
  int owners = 1;
  int64_t batch = 256;
  int pushes = 2000;
  int repeats = 3;
  bool pull = false;
  bool raw = true;     // --no-raw: the remote phase only (profiling)
  bool split = false;  // --split: each trainer prints when its own pushes and everyone's were received, and its step's seconds
  int threads = 0;     // --threads: the owners' update threads (0: OpenMP's default)
  int64_t push_log_bytes = -1;  // --push-log-bytes: RemoteOptions::push_log_bytes (-1: its default)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (key == "--rows") a.rows = std::stoll(next());
    else if (key == "--dim") a.dim = std::stoll(next());
    else if (key == "--owners") a.owners = std::stoi(next());
    else if (key == "--batch") a.batch = std::stoll(next());
    else if (key == "--pushes") a.pushes = std::stoi(next());
    else if (key == "--repeats") a.repeats = std::stoi(next());
    else if (key == "--pull") a.pull = true;
    else if (key == "--no-raw") a.raw = false;
    else if (key == "--split") a.split = true;
    else if (key == "--threads") a.threads = std::stoi(next());
    else if (key == "--push-log-bytes") a.push_log_bytes = std::stoll(next());
  }
  return a;
}

constexpr float kValue = 1.0f / 64;  // every pushed element: sums of it stay exact in f32
constexpr int kHeaderBytes = 48;
constexpr int kRawWindow = 64;            // raw sends in flight per trainer     // the remote request header the raw messages carry too

std::pair<int64_t, int64_t> rows_of(const Args& a, int owner) {
  return {a.rows * owner / a.owners, a.rows * (owner + 1) / a.owners};
}

// Trainer t's push i: B rows (distinct within the push) of owner i % O, the same on every rank.
std::vector<int64_t> push_rows_of(const Args& a, int trainer, int repeat, int i) {
  const auto range = rows_of(a, i % a.owners);
  std::mt19937_64 gen(static_cast<uint64_t>(trainer) * 1000003u + static_cast<uint64_t>(repeat) * 7919u +
                      static_cast<uint64_t>(i));
  std::uniform_int_distribution<int64_t> pick(range.first, range.second - 1);
  std::vector<int64_t> rows(static_cast<std::size_t>(a.batch));
  for (int64_t& r : rows) r = pick(gen);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  while (static_cast<int64_t>(rows.size()) < a.batch) rows.push_back(pick(gen));  // duplicates add twice
  return rows;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double slowest(Communicator& comm, double mine) {
  float v = static_cast<float>(mine);
  comm.all_reduce(&v, 1, DType::f32, ReduceOp::max);
  return v;
}

// What a raw owner does with each message it receives.
enum class RawOwner {
  transport,  // receives every message into the same buffer and drops it: transport alone
  keep,       // receives each into a buffer of its own, all kept to the phase's end, as any owner
              // that holds pushes until a step must (the buffers are reused from repeat to repeat)
  subtract,   // subtracts every received row from its own table (lr 1), the least a hand-written
              // MPI parameter server does with a push
};

// `table` is the subtracting owner's copy of its rows; `kept` the keeping owner's buffers.
double raw_phase(const Args& a, Communicator& comm, MPI_Comm raw, int trainers, int repeat, RawOwner owner,
                 std::vector<float>& table, std::vector<std::vector<char>>& kept) {
  const int rank = comm.rank();
  const std::size_t bytes = kHeaderBytes + static_cast<std::size_t>(a.batch) * (8 + 4 * static_cast<std::size_t>(a.dim));
  std::vector<char> payload(bytes, 0);
  std::vector<std::vector<int64_t>> rows;
  if (rank >= a.owners) {
    for (int i = 0; i < a.pushes; ++i) rows.push_back(push_rows_of(a, rank, repeat, i));
  }
  // This owner's share: pushes i with i % O == rank, from every trainer.
  const int mine = (a.pushes - rank + a.owners - 1) / a.owners;
  if (rank < a.owners && owner == RawOwner::keep) {
    // Made (and faulted in) before the clock starts, as the remote owner's pooled buffers are.
    kept.resize(static_cast<std::size_t>(mine * trainers), std::vector<char>(bytes));
  }
  comm.barrier();
  const Clock::time_point start = Clock::now();
  if (rank < a.owners) {
    std::vector<char> in(bytes);
    const int64_t first_row = rows_of(a, rank).first;
    for (int m = 0; m < mine * trainers; ++m) {
      char* into = owner == RawOwner::keep ? kept[static_cast<std::size_t>(m)].data() : in.data();
      MPI_Recv(into, static_cast<int>(bytes), MPI_BYTE, MPI_ANY_SOURCE, 1, raw, MPI_STATUS_IGNORE);
      if (owner != RawOwner::subtract) continue;
      const auto* rows = reinterpret_cast<const int64_t*>(in.data() + kHeaderBytes);
      const auto* values = reinterpret_cast<const float*>(in.data() + kHeaderBytes + a.batch * 8);
      for (int64_t i = 0; i < a.batch; ++i) {
        float* row = table.data() + (rows[i] - first_row) * a.dim;
        for (int64_t j = 0; j < a.dim; ++j) row[j] -= values[i * a.dim + j];
      }
    }
    char ack = 1;
    for (int t = a.owners; t < comm.size(); ++t) MPI_Send(&ack, 1, MPI_BYTE, t, 2, raw);
  } else {
    // A window of sends in flight: all of them at once makes Open MPI's matching crawl (20000
    // sends of 4.6 kB: 5.2 s against 0.008 s for 2000), which would flatter the comparison.
    std::vector<MPI_Request> sends(kRawWindow, MPI_REQUEST_NULL);
    // Each message is packed the way the remote optimizer packs a push (header, rows, values:
    // one contiguous send), from one buffer per window slot so a send never reads one in use.
    std::vector<std::vector<char>> packed(kRawWindow, payload);
    const std::vector<float> values(static_cast<std::size_t>(a.batch * a.dim), kValue);
    for (int i = 0; i < a.pushes; ++i) {
      MPI_Request& slot = sends[static_cast<std::size_t>(i % kRawWindow)];
      MPI_Wait(&slot, MPI_STATUS_IGNORE);
      std::vector<char>& message = packed[static_cast<std::size_t>(i % kRawWindow)];
      const std::vector<int64_t>& r = rows[static_cast<std::size_t>(i)];
      std::memcpy(message.data() + kHeaderBytes, r.data(), r.size() * sizeof(int64_t));
      std::memcpy(message.data() + kHeaderBytes + a.batch * 8, values.data(), values.size() * sizeof(float));
      MPI_Isend(message.data(), static_cast<int>(bytes), MPI_BYTE, i % a.owners, 1, raw, &slot);
    }
    MPI_Waitall(kRawWindow, sends.data(), MPI_STATUSES_IGNORE);
    for (int o = 0; o < a.owners; ++o) {
      char ack = 0;
      MPI_Recv(&ack, 1, MPI_BYTE, o, 2, raw, MPI_STATUS_IGNORE);
    }
  }
  return slowest(comm, rank < a.owners ? 0.0 : seconds_since(start));
}

struct RemoteTimes {
  double push = 0;   // the pushes, until every owner has received them
  double total = 0;  // push + step
};

// Waits for every trainer (`trainers`: the trainers' communicator) with sleeps between tests: a
// trainer that spun here would take the core an owner still receiving another trainer's pushes
// needs, where cores are few.
void wait_for_trainers(MPI_Comm trainers) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(trainers, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

RemoteTimes remote_phase(const Args& a, Communicator& comm, RemoteOptimizer& remote, int repeat,
                         MPI_Comm trainers) {
  const int rank = comm.rank();
  const std::vector<float> values(static_cast<std::size_t>(a.batch * a.dim), kValue);
  std::vector<float> pulled(values.size());
  std::vector<std::vector<int64_t>> rows;
  if (rank >= a.owners) {
    for (int i = 0; i < a.pushes; ++i) rows.push_back(push_rows_of(a, rank, repeat, i));
  }
  comm.barrier();
  const Clock::time_point start = Clock::now();
  double pushed = 0;
  if (rank >= a.owners) {
    const RemoteParam emb = remote.lookup("emb");
    const RemoteContext context = remote.open_context();
    for (int i = 0; i < a.pushes; ++i) {
      const auto& r = rows[static_cast<std::size_t>(i)];
      if (a.pull) remote.pull_rows(emb, r.data(), a.batch, pulled.data());
      remote.push_rows(context, emb, r.data(), a.batch, values.data());
    }
    // An owner answers a trainer's requests in order: its answer to this pull says it has
    // received (and absorbed) every push before it.
    for (int o = 0; o < a.owners; ++o) {
      const int64_t row = rows_of(a, o).first;
      remote.pull_rows(emb, &row, 1, pulled.data());
    }
    // Every trainer's pushes received before any step: an owner applies a step whole before
    // its next request, so a trainer stepping at once would put that step inside the push time
    // of a trainer still pushing.
    const double own_pushes = seconds_since(start);
    wait_for_trainers(trainers);
    pushed = seconds_since(start);
    remote.step(context);
    if (a.split) {
      std::fprintf(stderr, "trainer %d: its own pushes received %.4f s, every trainer's %.4f s, step %.4f s\n", rank,
                   own_pushes, pushed, seconds_since(start) - pushed);
    }
  }
  RemoteTimes t;
  t.push = slowest(comm, pushed);
  t.total = slowest(comm, rank < a.owners ? 0.0 : seconds_since(start));
  return t;
}

// Every element of the table: -(pushes of its row) * kValue, summed over repeats and trainers.
bool validate(const Args& a, Communicator& comm, RemoteOptimizer& remote) {
  int ok = 1;
  if (comm.rank() == a.owners) {
    std::vector<float> expected(static_cast<std::size_t>(a.rows), 0.f);
    for (int repeat = 0; repeat < a.repeats; ++repeat) {
      for (int t = a.owners; t < comm.size(); ++t) {
        for (int i = 0; i < a.pushes; ++i) {
          for (int64_t r : push_rows_of(a, t, repeat, i)) expected[static_cast<std::size_t>(r)] -= kValue;
        }
      }
    }
    std::vector<float> table(static_cast<std::size_t>(a.rows * a.dim));
    remote.pull(remote.lookup("emb"), table.data(), a.rows * a.dim);
    int64_t wrong_rows = 0;
    for (int64_t r = 0; r < a.rows; ++r) {
      for (int64_t j = 0; j < a.dim; ++j) {
        const float held = table[static_cast<std::size_t>(r * a.dim + j)];
        if (held == expected[static_cast<std::size_t>(r)]) continue;
        if (wrong_rows++ < 3) {
          std::fprintf(stderr, "table check: row %lld element %lld holds %.9g, expected %.9g\n",
                       static_cast<long long>(r), static_cast<long long>(j), held, expected[static_cast<std::size_t>(r)]);
        }
        break;
      }
    }
    if (wrong_rows > 0) std::fprintf(stderr, "table check: %lld of %lld rows wrong\n", static_cast<long long>(wrong_rows), static_cast<long long>(a.rows));
    ok = wrong_rows == 0;
  }
  float flag = static_cast<float>(ok);
  comm.all_reduce(&flag, 1, DType::f32, ReduceOp::max);  // only one rank checked; the others hold 1
  float bad = static_cast<float>(1 - ok);
  comm.all_reduce(&bad, 1, DType::f32, ReduceOp::max);
  return bad == 0.f;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  CommOptions comm_options;
  comm_options.timeout_seconds = 300;
  auto comm = remote_mpi_world(comm_options);
  const int rank = comm->rank();
  const int trainers = comm->size() - a.owners;
  if (trainers < 1 || a.owners < 1 || a.batch < 1 || a.pushes < 1) {
    if (rank == 0) std::fprintf(stderr, "need --owners >= 1, at least one more rank to train, --batch and --pushes >= 1\n");
    return 2;
  }
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  MPI_Comm trainer_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank >= a.owners ? 1 : MPI_UNDEFINED, rank, &trainer_comm);

  std::vector<RemoteGroupSpec> groups;
  if (rank < a.owners) {
    RemoteGroupSpec g;
    g.algorithm = Algorithm::sgd;
    g.hyper.lr = 1.0;
    const auto range = rows_of(a, rank);
    g.params.push_back({"emb", a.rows, a.dim, range.first, range.second, nullptr});
    groups.push_back(g);
  }
  RemoteOptions options;
  options.trainer = rank >= a.owners;
  options.timeout_seconds = 300;
  options.context_expiry_seconds = 600;
  options.cpu_threads = a.threads;
  if (a.push_log_bytes >= 0) options.push_log_bytes = a.push_log_bytes;
  RemoteOptimizer remote(comm, groups, options);

  const double push_bytes = static_cast<double>(kHeaderBytes + a.batch * (8 + 4 * a.dim));
  const double total_pushes = static_cast<double>(a.pushes) * trainers;
  double best_raw = 1e30, best_keep = 1e30, best_apply = 1e30, best_remote = 1e30, best_push = 1e30, best_step = 1e30;
  std::vector<float> raw_table;
  std::vector<std::vector<char>> raw_kept;
  if (rank < a.owners && !a.pull && a.raw) {
    raw_table.assign(static_cast<std::size_t>((rows_of(a, rank).second - rows_of(a, rank).first) * a.dim), 0.f);
  }
  for (int repeat = 0; repeat < a.repeats; ++repeat) {
    if (!a.pull && a.raw) {
      best_raw = std::min(best_raw, raw_phase(a, *comm, raw, trainers, repeat, RawOwner::transport, raw_table, raw_kept));
      best_keep = std::min(best_keep, raw_phase(a, *comm, raw, trainers, repeat, RawOwner::keep, raw_table, raw_kept));
      best_apply =
          std::min(best_apply, raw_phase(a, *comm, raw, trainers, repeat, RawOwner::subtract, raw_table, raw_kept));
    }
    const RemoteTimes t = remote_phase(a, *comm, remote, repeat, trainer_comm);
    best_remote = std::min(best_remote, t.total);
    best_push = std::min(best_push, t.push);
    best_step = std::min(best_step, t.total - t.push);
  }
  const bool valid = validate(a, *comm, remote);
  if (rank == 0) {
    std::printf("# shardopt-remote-bench: %lld x %lld f32 table on %d owner(s), %d trainer(s), %d pushes of %lld rows "
                "each per trainer (%.0f bytes a push)%s, best of %d\n",
                static_cast<long long>(a.rows), static_cast<long long>(a.dim), a.owners, trainers, a.pushes,
                static_cast<long long>(a.batch), push_bytes, a.pull ? ", each after a pull_rows of its rows" : "",
                a.repeats);
    std::printf("%-8s %12s %12s %10s\n", "phase", "seconds", "pushes/s", "GB/s");
    if (!a.pull && a.raw) {
      std::printf("%-8s %12.4f %12.0f %10.3f\n", "raw", best_raw, total_pushes / best_raw,
                  total_pushes * push_bytes / best_raw / 1e9);
      std::printf("%-8s %12.4f %12.0f %10.3f\n", "raw+keep", best_keep, total_pushes / best_keep,
                  total_pushes * push_bytes / best_keep / 1e9);
      std::printf("%-8s %12.4f %12.0f %10.3f\n", "raw+sub", best_apply, total_pushes / best_apply,
                  total_pushes * push_bytes / best_apply / 1e9);
    }
    if (!a.pull) {
      std::printf("%-8s %12.4f %12.0f %10.3f\n", "push", best_push, total_pushes / best_push,
                  total_pushes * push_bytes / best_push / 1e9);
      std::printf("%-8s %12.4f\n", "step", best_step);
    }
    std::printf("%-8s %12.4f %12.0f %10.3f\n", a.pull ? "pull+push" : "remote", best_remote, total_pushes / best_remote,
                total_pushes * push_bytes / best_remote / 1e9);
    // On one line: the push alone against transport and against transport into kept buffers,
    // and the whole cost (push + step) against transport and against transport plus the least
    // work per row.
    if (!a.pull && a.raw) {
      std::printf("push/raw %.3f  push/raw+keep %.3f  remote/raw %.3f  remote/raw+sub %.3f\n", best_raw / best_push,
                  best_keep / best_push, best_raw / best_remote, best_apply / best_remote);
    }
    std::printf("table check: %s\n", valid ? "ok" : "WRONG");
  }
  remote.close();
  if (rank < a.owners) {
    const RemoteStats st = remote.stats();
    std::printf("owner %d: %lld pushes received (%.1f MB), %lld contexts applied, %lld refused, %lld open\n", rank,
                static_cast<long long>(st.pushes_received), st.bytes_received / 1e6,
                static_cast<long long>(st.contexts_applied), static_cast<long long>(st.contexts_failed), static_cast<long long>(st.open_contexts));
  }
  MPI_Comm_free(&raw);
  if (trainer_comm != MPI_COMM_NULL) MPI_Comm_free(&trainer_comm);
  return valid ? 0 : 1;
}
