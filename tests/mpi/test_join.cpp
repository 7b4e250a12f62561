// tests/mpi/test_join.cpp — Join (uneven inputs): ranks with 3, 5, 7, ... batches equal a one-rank replay of the averaged gradients, bitwise; calls join() does not shadow fail on every rank.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

namespace {

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19};

// Rank r's gradient of param i at batch b: small integers, so every sum over ranks is exact in
// float whatever order MPI adds in, and the average is one float division on both sides.
float grad_value(int rank, int batch, std::size_t param, int64_t element) {
  return static_cast<float>((rank * 7 + batch * 3 + static_cast<int>(param) * 5 + element) % 9 - 4);
}

int batches_of(int rank) { return 3 + 2 * rank; }  // np 3: 3, 5 and 7

struct Setup {
  int stage = 1;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  bool divide_by_world = false;
  double clip = 0.0;
};

std::string describe(const Setup& s) {
  return "stage " + std::to_string(s.stage) + ", " + partition_name(s.partition) +
         (s.storage == Storage::external ? ", external" : ", bucket view") +
         (s.divide_by_world ? ", divide by world" : "") + (s.clip > 0 ? ", clipped" : "");
}

struct Model {
  shardopt_test::SeededParams params{kSizes, 11};
  std::unique_ptr<ZeroOptimizer> opt;

  Model(std::shared_ptr<Communicator> comm, const Setup& s) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.partition = s.partition;
    config.storage = s.storage;
    config.stage = s.stage;
    config.divide_by_initial_world_size = s.divide_by_world;
    config.bucket_bytes = 64 * 4;  // several buckets, some spanning params
    std::vector<ParamGroupSpec> groups{params.all(shardopt_test::busy_hyperparams(Algorithm::adamw),
                                                  s.storage == Storage::external)};
    opt = std::make_unique<ZeroOptimizer>(std::move(comm), config, std::move(groups));
  }

  // Hands this rank's gradients of `values(i, e)` to the optimizer, as the setup expects.
  template <typename Values>
  void hand(const Setup& s, Values&& values) {
    if (s.stage == 2 && s.storage == Storage::bucket_view) {
      // Backward order: last param first.
      for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
        std::vector<float> g(static_cast<std::size_t>(kSizes[static_cast<std::size_t>(i)]));
        for (std::size_t e = 0; e < g.size(); ++e) g[e] = values(static_cast<std::size_t>(i), static_cast<int64_t>(e));
        opt->reduce_gradient(i, TensorRef{g.data(), static_cast<int64_t>(g.size())});
      }
    } else {
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        const TensorRef g = opt->grad_view(static_cast<ParamId>(i));
        for (int64_t e = 0; e < g.numel; ++e) g.as<float>()[e] = values(i, e);
      }
    }
    opt->reduce_gradients();
    if (s.clip > 0) opt->clip_grad_norm(s.clip);
  }
};

// The same training on one rank, fed the averages the ranks' reduction computes.
std::vector<float> replay(const Setup& s) {
  const int world_size = world()->size();
  Setup one = s;
  one.stage = 1;
  one.storage = Storage::bucket_view;
  Model m(world()->split(world()->rank(), 0), one);
  const int longest = batches_of(world_size - 1);
  for (int b = 0; b < longest; ++b) {
    int active = 0;
    for (int r = 0; r < world_size; ++r) active += batches_of(r) > b ? 1 : 0;
    const float divisor = static_cast<float>(s.divide_by_world ? world_size : active);
    m.hand(one, [&](std::size_t i, int64_t e) {
      float sum = 0.f;
      for (int r = 0; r < world_size; ++r) sum += batches_of(r) > b ? grad_value(r, b, i, e) : 0.f;
      return sum / divisor;
    });
    m.opt->step();
  }
  return shardopt_test::all_params(*m.opt);
}

std::vector<float> train_uneven(const Setup& s, std::shared_ptr<Communicator> comm = world()) {
  const int rank = comm->rank();
  Model m(std::move(comm), s);
  for (int b = 0; b < batches_of(rank); ++b) {
    m.hand(s, [&](std::size_t i, int64_t e) { return grad_value(rank, b, i, e); });
    m.opt->step();
  }
  m.opt->join();
  // Every rank left join(): the optimizer is usable again by all of them.
  m.opt->consolidate_state_dict(0);
  return shardopt_test::all_params(*m.opt);
}

}  // namespace

TEST_CASE("uneven inputs under join() equal a one-rank replay of the averaged gradients", "[join]") {
  std::vector<Setup> setups;
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage storage : {Storage::bucket_view, Storage::external}) {
        Setup s;
        s.stage = stage;
        s.partition = partition;
        s.storage = storage;
        setups.push_back(s);
      }
    }
  }
  Setup by_world;
  by_world.divide_by_world = true;
  setups.push_back(by_world);
  Setup clipped;
  clipped.clip = 0.5;
  setups.push_back(clipped);
  Setup clipped_stage2 = clipped;
  clipped_stage2.stage = 2;
  setups.push_back(clipped_stage2);
  for (const Setup& s : setups) {
    INFO(describe(s));
    const std::vector<float> expected = replay(s);
    const std::vector<float> got = train_uneven(s);
    REQUIRE(got.size() == expected.size());
    CHECK(shardopt_test::bitwise_equal(got, expected));
  }
}

TEST_CASE("uneven inputs under join() across nodes of equal size (the hierarchical average) equal the replay",
          "[join][node_reduce]") {
  // Nodes of 2 ranks (CommOptions.ranks_per_node): node-shared gradient slots on each node and
  // the node sums all-reduced across, with the joined ranks' zeros in their slots.
  if (world()->size() != 4) return;
  CommOptions options;
  options.timeout_seconds = 20;
  options.ranks_per_node = 2;
  const std::shared_ptr<Communicator> comm = mpi_world(options);
  for (int stage : {1, 2}) {
    for (Storage storage : {Storage::bucket_view, Storage::external}) {
      Setup s;
      s.stage = stage;
      s.storage = storage;
      INFO(describe(s));
      const std::vector<float> got = train_uneven(s, comm);
      CHECK(shardopt_test::bitwise_equal(got, replay(s)));
    }
  }
}

TEST_CASE("divide_by_initial_world_size changes the result once a rank has joined", "[join]") {
  if (world()->size() < 2) return;
  Setup active_count;
  Setup world_count;
  world_count.divide_by_world = true;
  CHECK_FALSE(shardopt_test::bitwise_equal(replay(active_count), replay(world_count)));
}

TEST_CASE("a call join() does not shadow fails on every rank, naming it and the joined rank", "[join]") {
  const int world_size = world()->size();
  if (world_size < 2) return;
  const int rank = world()->rank();
  Setup s;
  Model m(world(), s);
  const int last = world_size - 1;
  const auto [code, message] = error_of([&] {
    if (rank == last) {
      m.opt->join();
    } else {
      m.opt->consolidate_state_dict(0);
    }
  });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("consolidate_state_dict(): rank " + std::to_string(last) + " is in join()"));
}

TEST_CASE("a joined rank with other hyperparameters than the active ranks fails the step on every rank", "[join]") {
  const int world_size = world()->size();
  if (world_size < 2) return;
  const int rank = world()->rank();
  Setup s;
  Model m(world(), s);
  const int last = world_size - 1;
  const auto [code, message] = error_of([&] {
    if (rank == last) {
      m.opt->hyperparams(0).lr = 0.5;  // changed after it ran out of inputs
      m.opt->join();
    } else {
      m.hand(s, [&](std::size_t i, int64_t e) { return grad_value(rank, 0, i, e); });
      m.opt->step();
    }
  });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(message, Catch::Contains("rank " + std::to_string(last) + " is in join() with other hyperparameters"));
}

TEST_CASE("join() returns at once when every rank joins, and the config's divisor option is agreed", "[join]") {
  Setup s;
  Model m(world(), s);
  const std::vector<float> before = shardopt_test::all_params(*m.opt);
  m.opt->join();
  CHECK(shardopt_test::bitwise_equal(shardopt_test::all_params(*m.opt), before));
  CHECK_FALSE(m.opt->join_step());

  if (world()->size() < 2) return;
  const auto [code, message] = error_of([&] {
    Setup mine;
    mine.divide_by_world = world()->rank() == 1;
    Model other(world(), mine);
  });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(message, Catch::Contains("config.divide_by_initial_world_size"));
}
