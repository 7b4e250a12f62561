// tests/remote/test_remote_push_log.cpp — pushes logged on the owner and summed later: a context pushed past the log cap gives the same bits as one logged whole, as one summed on arrival and as a local ZeroOptimizer; an expired context's log and sums go back to the pool.
#include <chrono>
#include <random>
#include <thread>

#include "remote_table_reference.hpp"

using namespace shardopt;
using namespace shardopt_test;

namespace {

constexpr int64_t kRows = 9000, kRowSize = 4, kPushRows = 3000;  // a push: 3000 rows, 72 kB on the wire
constexpr int kSteps = 2, kPushes = 4;
constexpr double kLr = 0.5;

std::vector<int64_t> rows_of(int t, int k, int i) {
  std::mt19937_64 gen(static_cast<uint64_t>(6007 * t + 7877 * k + i));
  std::uniform_int_distribution<int64_t> pick(0, kRows - 1);
  std::vector<int64_t> rows(kPushRows);
  for (int64_t& r : rows) r = pick(gen);
  return rows;
}

std::vector<float> values_of(int t, int k, int i) {
  return seeded_values(static_cast<uint32_t>(9000 + 100 * t + 10 * k + i), kPushRows * kRowSize);
}

std::vector<float> dense_of(int t, int k) { return seeded_values(static_cast<uint32_t>(700 + 10 * t + k), kRows * kRowSize); }

std::vector<RowPush> table_pushes_of(int t, int k) {
  std::vector<RowPush> pushes;
  for (int i = 0; i < kPushes; ++i) pushes.push_back({rows_of(t, k, i), values_of(t, k, i)});
  return pushes;
}

// Every rank trains: per step, kPushes row pushes and then one dense push of the whole table
// (144 kB, itself past a small cap) into one context. Returns the table after every step.
std::vector<float> train(const std::vector<float>& initial, int64_t push_log_bytes) {
  auto& comm = world();
  const int rank = comm->rank();
  const int owners = std::min(comm->size(), 2);
  std::vector<RemoteGroupSpec> groups;
  if (rank < owners) {
    RemoteGroupSpec g;
    g.algorithm = Algorithm::sgd;
    g.hyper.lr = kLr;
    const int64_t begin = kRows * rank / owners, end = kRows * (rank + 1) / owners;
    g.params.push_back({"table", kRows, kRowSize, begin, end, initial.data() + begin * kRowSize});
    groups.push_back(g);
  }
  RemoteOptions options;
  options.order = RemoteOrder::deterministic;
  options.timeout_seconds = 20;
  options.push_log_bytes = push_log_bytes;
  RemoteOptimizer remote(comm, groups, options);
  const RemoteParam table = remote.lookup("table");
  for (int k = 0; k < kSteps; ++k) {
    const RemoteContext context = remote.open_context();
    std::vector<std::vector<int64_t>> rows;
    std::vector<std::vector<float>> values;
    for (int i = 0; i < kPushes; ++i) {
      rows.push_back(rows_of(rank, k, i));
      values.push_back(values_of(rank, k, i));
      remote.push_rows(context, table, rows.back().data(), kPushRows, values.back().data());
    }
    const std::vector<float> dense = dense_of(rank, k);
    remote.push(context, table, dense.data(), kRows * kRowSize);
    remote.step(context);
  }
  comm->barrier();  // every trainer's steps applied
  std::vector<float> pulled(static_cast<std::size_t>(kRows * kRowSize));
  remote.pull(table, pulled.data(), kRows * kRowSize);
  comm->barrier();  // every rank has pulled before any closes
  remote.close();
  return pulled;
}

}  // namespace

TEST_CASE("remote push log: a context pushed past the log cap is bitwise one logged whole and a local ZeroOptimizer",
          "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int size = comm->size();
  const std::vector<float> initial = seeded_values(91, kRows * kRowSize);
  const std::vector<float> past_cap = train(initial, 100000);      // summed every 2 row pushes, and at each dense one
  const std::vector<float> logged_whole = train(initial, int64_t{1} << 30);  // summed when idle or at the step
  const std::vector<float> on_arrival = train(initial, 0);         // every push summed as it arrives

  // The reference: the whole table on one rank over each context's row pushes and dense push.
  const std::vector<float> expected =
      sgd_table_reference(comm->split(rank, 0), initial, kRowSize, kLr, kSteps, size, TablePushes{table_pushes_of, dense_of});
  CHECK(bitwise_equal(past_cap, logged_whole));
  CHECK(bitwise_equal(past_cap, on_arrival));
  CHECK(bitwise_equal(past_cap, expected));
  CHECK_FALSE(bitwise_equal(past_cap, initial));
}

TEST_CASE("remote push log: a context left unstepped expires, its logged pushes and sums back in the pool",
          "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int size = comm->size();
  const std::vector<float> initial = seeded_values(92, kRows * kRowSize);
  std::vector<RemoteGroupSpec> groups;
  if (rank == 0) {
    RemoteGroupSpec g;
    g.algorithm = Algorithm::sgd;
    g.hyper.lr = kLr;
    g.params.push_back({"table", kRows, kRowSize, 0, kRows, initial.data()});
    groups.push_back(g);
  }
  RemoteOptions options;
  options.timeout_seconds = 20;
  options.context_expiry_seconds = 1.0;
  RemoteOptimizer remote(comm, groups, options);
  const RemoteParam table = remote.lookup("table");
  const RemoteContext context = remote.open_context();
  const RemoteContext alive = remote.open_context();
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::vector<float>> values;
  for (int i = 0; i < kPushes; ++i) {
    rows.push_back(rows_of(rank, 0, i));
    values.push_back(values_of(rank, 0, i));
    remote.push_rows(context, table, rows.back().data(), kPushRows, values.back().data());
  }
  // The owner answers requests in order: this pull's answer says it holds every push above
  // (a large push's bytes move only while its trainer is in MPI, not while it sleeps).
  const int64_t first_row = 0;
  std::vector<float> one_row(kRowSize);
  remote.pull_rows(table, &first_row, 1, one_row.data());
  // The context is left past the expiry, as by a trainer that died, while another context keeps
  // the trainers heard (were every trainer silent, the owner would count them gone and stop).
  for (int i = 0; i < 25; ++i) {
    remote.push_rows(alive, table, nullptr, 0, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  comm->barrier();
  if (rank == 0) {
    const RemoteStats stats = remote.stats();
    CHECK(stats.contexts_expired == size);
    CHECK(stats.open_contexts == size);  // the live ones, holding empty pushes at most
    CHECK(stats.accumulator_bytes < kPushRows * kRowSize * static_cast<int64_t>(sizeof(float)));
    // One context held at least its distinct rows (logged, summed, or both): that much is pooled.
    std::vector<char> seen(kRows, 0);
    int64_t distinct = 0;
    for (const auto& r : rows) {
      for (int64_t row : r) distinct += seen[static_cast<std::size_t>(row)]++ == 0 ? 1 : 0;
    }
    INFO("pooled_bytes " << stats.pooled_bytes << ", distinct rows " << distinct);
    CHECK(stats.pooled_bytes >= distinct * kRowSize * static_cast<int64_t>(sizeof(float)));
  }
  comm->barrier();
  remote.step(alive);
  try {
    remote.step(context);
    FAIL("the expired context's step was accepted");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("expired") != std::string::npos);
  }
  std::vector<float> pulled(static_cast<std::size_t>(kRows * kRowSize));
  remote.pull(table, pulled.data(), kRows * kRowSize);
  CHECK(bitwise_equal(pulled, initial));  // nothing of the expired pushes applied
  comm->barrier();
  remote.close();
}
