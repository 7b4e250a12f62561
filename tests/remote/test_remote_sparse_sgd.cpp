// tests/remote/test_remote_sparse_sgd.cpp — plain SGD (no momentum, no weight decay) over sparse rows, the owners' row-only update: bitwise a local ZeroOptimizer stepping the whole table on the same sums, over more rows than one update block, with repeated rows, empty pushes, rows split over owners and sums' buffers reused across contexts.
#include <random>

#include "remote_table_reference.hpp"

using namespace shardopt;
using namespace shardopt_test;

namespace {

constexpr int64_t kRows = 9000, kRowSize = 4;  // 9000 rows of 16 bytes: three 64 kB update blocks
constexpr int kSteps = 3, kPushes = 3;
constexpr double kLr = 0.5;

// Trainer t's push i of step k: 3000 rows drawn with repeats (and row kRows - 1 always).
std::vector<int64_t> rows_of(int t, int k, int i) {
  std::mt19937_64 gen(static_cast<uint64_t>(7919 * t + 104729 * k + i));
  std::uniform_int_distribution<int64_t> pick(0, kRows - 1);
  std::vector<int64_t> rows(3000);
  for (int64_t& r : rows) r = pick(gen);
  rows.back() = kRows - 1;
  return rows;
}

std::vector<float> values_of(int t, int k, int i) {
  return seeded_values(static_cast<uint32_t>(5000 + 100 * t + 10 * k + i), 3000 * kRowSize);
}

std::vector<RowPush> table_pushes_of(int t, int k) {
  std::vector<RowPush> pushes;
  for (int i = 0; i < kPushes; ++i) pushes.push_back({rows_of(t, k, i), values_of(t, k, i)});
  return pushes;
}

}  // namespace

TEST_CASE("remote plain SGD over sparse rows: bitwise a local ZeroOptimizer on the same sums", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int size = comm->size();
  const std::vector<float> initial = seeded_values(77, kRows * kRowSize);
  const int owners = std::min(size, 2);
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
  RemoteOptimizer remote(comm, groups, options);
  const RemoteParam table = remote.lookup("table");
  for (int k = 0; k < kSteps; ++k) {
    const RemoteContext context = remote.open_context();
    std::vector<std::vector<int64_t>> rows;
    std::vector<std::vector<float>> values;
    for (int i = 0; i < kPushes; ++i) {
      rows.push_back(rows_of(rank, k, i));
      values.push_back(values_of(rank, k, i));
      remote.push_rows(context, table, rows.back().data(), static_cast<int64_t>(rows.back().size()),
                       values.back().data());
    }
    remote.push_rows(context, table, nullptr, 0, nullptr);  // empty: accepted, adds nothing
    remote.step(context);
  }
  comm->barrier();  // every trainer's steps applied

  // The reference: the whole table stepped on one rank over each context's summed row pushes.
  const std::vector<float> expected =
      sgd_table_reference(comm->split(rank, 0), initial, kRowSize, kLr, kSteps, size, TablePushes{table_pushes_of, nullptr});

  std::vector<float> pulled(static_cast<std::size_t>(kRows * kRowSize));
  remote.pull(table, pulled.data(), kRows * kRowSize);
  CHECK(bitwise_equal(pulled, expected));
  CHECK_FALSE(bitwise_equal(pulled, initial));
  const std::vector<int64_t> asked = {kRows - 1, 0, kRows / 2, kRows - 1};
  std::vector<float> rows_pulled(asked.size() * kRowSize);
  remote.pull_rows(table, asked.data(), static_cast<int64_t>(asked.size()), rows_pulled.data());
  for (std::size_t j = 0; j < asked.size(); ++j) {
    CHECK(std::memcmp(rows_pulled.data() + j * kRowSize, expected.data() + asked[j] * kRowSize,
                      kRowSize * sizeof(float)) == 0);
  }
  comm->barrier();  // every rank has pulled before any closes
  remote.close();
}
