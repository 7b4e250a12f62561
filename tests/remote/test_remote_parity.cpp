// tests/remote/test_remote_parity.cpp — the remote optimizer in deterministic order is bitwise a local one-rank ZeroOptimizer fed the same summed gradients, at 1-3 owners and 1-3 trainers; sparse rows, pull and pull_rows.
#include "remote_model.hpp"
#include "remote_reference.hpp"

using namespace shardopt;
using namespace shardopt_test;

namespace {

constexpr int kSteps = 3;

struct Roles {
  std::vector<int> owners;
  std::vector<int> trainers;
};

std::vector<Roles> roles_for(int n) {
  switch (n) {
    case 1: return {{{0}, {0}}};
    case 2: return {{{0}, {1}}, {{0, 1}, {0, 1}}, {{0, 1}, {1}}};
    case 3: return {{{0}, {1, 2}}, {{0, 1, 2}, {0, 1, 2}}, {{0, 1}, {2}}};
    default: return {{{0}, {1, 2, 3}}, {{0, 1, 2}, {3}}, {{0, 1, 2}, {1, 2, 3}}};
  }
}

bool has(const std::vector<int>& ranks, int rank) { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }

}  // namespace

TEST_CASE("remote deterministic order: bitwise a local ZeroOptimizer fed the same summed gradients", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const std::shared_ptr<Communicator> alone = comm->split(rank, 0);
  for (const Roles& roles : roles_for(comm->size())) {
    INFO("owners " << roles.owners.size() << " (first " << roles.owners.front() << "), trainers "
                   << roles.trainers.size() << " (first " << roles.trainers.front() << ")");
    const std::vector<RemoteModelParam> model = remote_model(roles.owners);
    RemoteOptions options;
    options.order = RemoteOrder::deterministic;
    options.trainer = has(roles.trainers, rank);
    options.timeout_seconds = 20;
    RemoteOptimizer remote(comm, owned_groups(model, rank), options);
    CHECK(remote.param_names() == std::vector<std::string>{"b", "emb", "w"});
    CHECK(remote.owners(remote.lookup("emb")).size() == roles.owners.size());
    if (options.trainer) {
      for (int k = 0; k < kSteps; ++k) run_remote_step(remote, rank, k, k == 1);
    }
    comm->barrier();  // every trainer's steps returned: applied on every owner
    if (options.trainer) {
      LocalReference reference(alone, model);
      for (int k = 0; k < kSteps; ++k) {
        for (int t : roles.trainers) reference.apply(pushes_of(t, k));
      }
      for (const RemoteModelParam& p : model) {
        INFO("parameter " << p.name);
        std::vector<float> pulled(static_cast<std::size_t>(p.numel()));
        remote.pull(remote.lookup(p.name), pulled.data(), p.numel());
        const std::vector<float> expected = reference.values(p.name);
        CHECK(bitwise_equal(pulled, expected));
        CHECK_FALSE(bitwise_equal(pulled, p.initial));  // the steps did change it
        // Rows in any order, repeated, across owners.
        const std::vector<int64_t> rows = {p.rows - 1, 0, p.rows / 2, 0};
        std::vector<float> some(rows.size() * static_cast<std::size_t>(p.row_size));
        remote.pull_rows(remote.lookup(p.name), rows.data(), static_cast<int64_t>(rows.size()), some.data());
        std::vector<float> want;
        for (int64_t r : rows) want.insert(want.end(), expected.begin() + r * p.row_size, expected.begin() + (r + 1) * p.row_size);
        CHECK(bitwise_equal(some, want));
      }
    }
    remote.close();
    const RemoteStats stats = remote.stats();
    if (has(roles.owners, rank)) {
      CHECK(stats.contexts_applied == kSteps * static_cast<int64_t>(roles.trainers.size()));
      CHECK(stats.contexts_failed == 0);
      CHECK(stats.open_contexts == 0);
    }
  }
}

TEST_CASE("remote arrival order: every trainer's steps applied once on every owner", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int n = comm->size();
  std::vector<int> owners = {0};
  if (n > 2) owners.push_back(1);
  const std::vector<RemoteModelParam> model = remote_model(owners);
  RemoteOptions options;
  options.trainer = n == 1 || rank > 0;
  options.timeout_seconds = 20;
  RemoteOptimizer remote(comm, owned_groups(model, rank), options);
  if (options.trainer) {
    for (int k = 0; k < kSteps; ++k) run_remote_step(remote, rank, k, k == 2);
  }
  comm->barrier();
  const int trainers = n == 1 ? 1 : n - 1;
  if (options.trainer && trainers == 1) {
    // One trainer: arrival order is its order, so the local reference still holds bitwise.
    const std::shared_ptr<Communicator> alone = comm->split(rank, 0);
    LocalReference reference(alone, model);
    for (int k = 0; k < kSteps; ++k) reference.apply(pushes_of(rank, k));
    for (const RemoteModelParam& p : model) {
      std::vector<float> pulled(static_cast<std::size_t>(p.numel()));
      remote.pull(remote.lookup(p.name), pulled.data(), p.numel());
      CHECK(bitwise_equal(pulled, reference.values(p.name)));
    }
  } else if (trainers == 1) {
    comm->split(rank, 0);
  }
  remote.close();
  if (has(owners, rank)) CHECK(remote.stats().contexts_applied == kSteps * trainers);
}
