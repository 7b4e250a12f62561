// tests/remote/test_remote_checkpoint.cpp — owners' parameters and state saved by 2 owners load onto 1 or 3 owners and train on bitwise as if never interrupted; a damaged shard is refused on every rank with nothing changed.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "remote_model.hpp"
#include "remote_reference.hpp"

using namespace shardopt;
using namespace shardopt_test;

namespace {

// A directory every rank sees: rank 0 creates it, the others learn its name.
std::string shared_temp_dir(Communicator& comm) {
  std::array<char, 256> name{};
  if (comm.rank() == 0) {
    std::snprintf(name.data(), name.size(), "%s/shardopt-remote-ckpt.XXXXXX",
                  std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(name.data()) != nullptr);
  }
  comm.broadcast(name.data(), static_cast<int64_t>(name.size()), DType::byte, 0);
  return name.data();
}

std::vector<float> pull_all(RemoteOptimizer& remote, const RemoteModelParam& p) {
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  remote.pull(remote.lookup(p.name), out.data(), p.numel());
  return out;
}

RemoteOptions deterministic_options() {
  RemoteOptions options;
  options.order = RemoteOrder::deterministic;
  options.timeout_seconds = 20;
  return options;
}

}  // namespace

TEST_CASE("remote checkpoint: saved by 2 owners, loaded by 1 and 3, trains on bitwise", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int n = comm->size();
  if (n < 2) return;
  const std::string dir = shared_temp_dir(*comm);
  {
    const std::vector<RemoteModelParam> model = remote_model({0, 1});
    RemoteOptimizer remote(comm, owned_groups(model, rank), deterministic_options());
    for (int k = 0; k < 2; ++k) run_remote_step(remote, rank, k);
    comm->barrier();
    remote.save(dir);
    remote.save(dir);  // a second save into the same directory replaces the first
    remote.close();
  }
  std::vector<std::vector<int>> resharded = {{0}};
  if (n >= 3) resharded.push_back({0, 1, 2});
  for (const std::vector<int>& owners : resharded) {
    INFO(owners.size() << " owners after the load");
    const std::vector<RemoteModelParam> model = remote_model(owners);
    RemoteOptimizer remote(comm, owned_groups(model, rank), deterministic_options());
    remote.load(dir);
    for (int k = 2; k < 4; ++k) run_remote_step(remote, rank, k);
    comm->barrier();
    const std::shared_ptr<Communicator> alone = comm->split(rank, 0);
    LocalReference reference(alone, model);
    for (int k = 0; k < 4; ++k) {
      for (int t = 0; t < n; ++t) reference.apply(pushes_of(t, k));
    }
    for (const RemoteModelParam& p : model) {
      INFO("parameter " << p.name);
      CHECK(bitwise_equal(pull_all(remote, p), reference.values(p.name)));
    }
    remote.close();
  }

  // A damaged shard: every rank refuses the load by name, and the parameters stay as they were.
  const std::vector<RemoteModelParam> model = remote_model({0});
  RemoteOptimizer remote(comm, owned_groups(model, rank), deterministic_options());
  const std::vector<float> before = pull_all(remote, model[0]);
  comm->barrier();
  if (rank == 0) {
    std::string shard;
    for (const auto& entry : std::filesystem::directory_iterator(dir + "/adamw")) {
      if (entry.path().filename() != "manifest.json") shard = entry.path().string();
    }
    REQUIRE(!shard.empty());
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  comm->barrier();
  try {
    remote.load(dir);
    FAIL("a damaged shard loaded");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == ErrorCode::corrupt);
    CHECK(std::string(e.what()).find("adamw") != std::string::npos);
  }
  CHECK(bitwise_equal(pull_all(remote, model[0]), before));
  remote.close();
  comm->barrier();
  if (rank == 0 && std::getenv("SHARDOPT_TEST_KEEP_DIR") == nullptr) std::filesystem::remove_all(dir);
}
