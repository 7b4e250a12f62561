// tests/mpi/test_zero_optimizer.cpp — N-rank steps equal 1-rank steps bitwise, state sizes, torch's scenarios.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;
using shardopt_test::world;

namespace {

// A model: named params with initial values and their own gradient buffers (external mode).
struct Model {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;
  bool external = false;  // pass our gradient buffers (external storage) or let shardopt own them

  Model(const std::vector<int64_t>& sizes, uint32_t seed) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(seeded_values(seed + static_cast<uint32_t>(i), sizes[i]));
      grads.emplace_back(static_cast<std::size_t>(sizes[i]), 0.f);
    }
  }

  ParamGroupSpec group(std::size_t first, std::size_t last, const Hyperparams& hyper) {
    ParamGroupSpec g;
    g.hyper = hyper;
    for (std::size_t i = first; i < last; ++i) {
      ParamSpec p;
      p.name = names[i];
      p.param = TensorRef{values[i].data(), static_cast<int64_t>(values[i].size())};
      if (external) p.grad = TensorRef{grads[i].data(), static_cast<int64_t>(grads[i].size())};
      g.params.push_back(p);
    }
    return g;
  }
};

// Gradient for `param` at `step`: identical on every rank, so reduce_gradients is not needed.
void write_grad(ZeroOptimizer& opt, ParamId id, int step) {
  TensorRef g = opt.grad_view(id);
  const auto values = seeded_values(1000u + static_cast<uint32_t>(step * 97 + id), g.numel);
  if (g.numel > 0) std::memcpy(g.data, values.data(), g.nbytes());
}

const std::vector<int64_t> kSizes = {13, 1, 0, 64, 7, 100, 3, 31};

// Trains `steps` steps on `comm` and returns every param's final values.
std::vector<float> train(std::shared_ptr<Communicator> comm, OptimizerConfig config, int steps) {
  Model model(kSizes, 42);
  model.external = config.storage == Storage::external;
  Hyperparams h0 = shardopt_test::busy_hyperparams(config.algorithm), h1 = h0;
  h1.lr *= 0.5;
  h1.maximize = true;
  ZeroOptimizer opt(comm, config, {model.group(0, 5, h0), model.group(5, kSizes.size(), h1)});
  for (int s = 0; s < steps; ++s) {
    for (ParamId id = 0; id < opt.num_params(); ++id) write_grad(opt, id, s);
    if (s == 2) opt.hyperparams(0).lr *= 0.1;  // an LR schedule
    opt.step();
  }
  return all_params(opt);
}

std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

}  // namespace

TEST_CASE("N ranks produce the bytes one rank produces", "[zero]") {
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage storage : {Storage::bucket_view, Storage::external}) {
        CAPTURE(algorithm_name(algorithm), partition_name(partition), static_cast<int>(storage));
        OptimizerConfig config;
        config.algorithm = algorithm;
        config.partition = partition;
        config.storage = storage;
        config.bucket_bytes = 40;  // many buckets even for these tiny params
        const auto sharded = train(world(), config, 5);
        const auto single = train(solo(), config, 5);
        config.shard_state = false;
        const auto replicated = train(world(), config, 5);
        REQUIRE(bitwise_equal(sharded, single));
        REQUIRE(bitwise_equal(replicated, single));
        // ...and training moved the params at all.
        REQUIRE_FALSE(bitwise_equal(single, Model(kSizes, 42).values[0]));
      }
    }
  }
}

TEST_CASE("optimizer state per rank is exactly this rank's share", "[zero][memory]") {
  const int n = world()->size(), me = world()->rank();
  const int64_t total = std::accumulate(kSizes.begin(), kSizes.end(), int64_t{0});  // 219
  Model model(kSizes, 1);
  Hyperparams adam;
  OptimizerConfig config;
  SECTION("flat: ceil(P/N) rounded up to 16 elements, two fp32 moments") {
    ZeroOptimizer opt(world(), config, {model.group(0, kSizes.size(), adam)});
    const int64_t shard = ((total + n - 1) / n + 15) / 16 * 16;
    const MemoryReport report = opt.memory_report();
    REQUIRE(report.shard_numel == shard);
    REQUIRE(report.trainable_numel == total);
    REQUIRE(report.state_bytes == 2 * 4 * shard);
    // The bucket view: a padded full copy, one per node (all ranks here share one node).
    REQUIRE(report.param_bytes + report.node_shared_param_bytes == 4 * n * shard);
    REQUIRE(report.node_shared_param_bytes == (n > 1 ? 4 * n * shard : 0));
    REQUIRE(report.node_ranks == (n > 1 ? n : 1));
    REQUIRE(report.grad_bytes == 4 * n * shard);
    REQUIRE(report.buffer_bytes == 0);  // bucket view at stage 1 stages nothing
  }
  SECTION("sorted_greedy: exactly the elements of the params this rank owns") {
    config.partition = PartitionStrategy::sorted_greedy;
    config.algorithm = Algorithm::sgd;
    Hyperparams sgd;
    sgd.momentum = 0.9;
    ZeroOptimizer opt(world(), config, {model.group(0, kSizes.size(), sgd)});
    int64_t owned = 0;
    for (ParamId id = 0; id < opt.num_params(); ++id) owned += opt.param_owner(id) == me ? kSizes[static_cast<std::size_t>(id)] : 0;
    REQUIRE(opt.memory_report().state_bytes == 4 * owned);  // one momentum buffer
    // The sum over ranks is the whole model.
    float all = static_cast<float>(owned);
    world()->all_reduce(&all, 1, DType::f32, ReduceOp::sum);
    REQUIRE(all == static_cast<float>(total));
  }
  SECTION("replicated: the whole model on every rank") {
    config.shard_state = false;
    Hyperparams amsgrad;
    amsgrad.amsgrad = true;
    ZeroOptimizer opt(world(), config, {model.group(0, kSizes.size(), amsgrad)});
    REQUIRE(opt.memory_report().state_bytes == 3 * 4 * total);
  }
}

TEST_CASE("torch's sharding case: [9,7,5,3] x world gives every rank 24 elements", "[zero]") {
  std::vector<int64_t> sizes;
  for (int r = 0; r < world()->size(); ++r) sizes.insert(sizes.end(), {9, 7, 5, 3});
  Model model(sizes, 3);
  OptimizerConfig config;
  config.partition = PartitionStrategy::sorted_greedy;
  ZeroOptimizer opt(world(), config, {model.group(0, sizes.size(), Hyperparams{})});
  REQUIRE(opt.memory_report().shard_numel == 24);
  REQUIRE(opt.memory_report().state_bytes == 2 * 4 * 24);
}

TEST_CASE("step(closure) calls the closure once and returns its loss", "[zero]") {
  Model model({5, 6}, 9);
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  Hyperparams h;
  h.lr = 0.5;
  ZeroOptimizer opt(world(), config, {model.group(0, 2, h)});
  const std::vector<float> before = all_params(opt);
  int calls = 0;
  const double loss = opt.step([&] {
    ++calls;
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      TensorRef g = opt.grad_view(id);
      for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 2.0f;  // set inside the closure
    }
    return 3.25;
  });
  REQUIRE(calls == 1);
  REQUIRE(loss == 3.25);
  const std::vector<float> after = all_params(opt);
  for (std::size_t i = 0; i < after.size(); ++i) REQUIRE(after[i] == before[i] + (-0.5f) * 2.0f);
}

TEST_CASE("an LR change between steps takes effect at the next step", "[zero]") {
  Model model({33}, 5);
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  Hyperparams h;
  h.lr = 0.25;
  ZeroOptimizer opt(world(), config, {model.group(0, 1, h)});
  auto set_grads = [&](float v) {
    TensorRef g = opt.grad_view(0);
    for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = v;
  };
  set_grads(1.0f);
  const std::vector<float> p0 = all_params(opt);
  opt.step();
  opt.hyperparams(0).lr = 0.125;
  opt.step();
  const std::vector<float> p2 = all_params(opt);
  for (std::size_t i = 0; i < p2.size(); ++i) REQUIRE(p2[i] == (p0[i] + (-0.25f) * 1.0f) + (-0.125f) * 1.0f);
}

TEST_CASE("add_param_group keeps earlier assignments and state", "[zero]") {
  for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
    CAPTURE(partition_name(partition));
    auto run = [&](std::shared_ptr<Communicator> comm, std::vector<int>* owners_before,
                   std::vector<int>* owners_after) {
      Model model({9, 7, 5, 3, 3, 11}, 17);
      OptimizerConfig config;
      config.partition = partition;
      ZeroOptimizer opt(comm, config, {model.group(0, 4, Hyperparams{})});
      for (int s = 0; s < 2; ++s) {
        for (ParamId id = 0; id < opt.num_params(); ++id) write_grad(opt, id, s);
        opt.step();
      }
      if (owners_before) for (ParamId id = 0; id < 4; ++id) owners_before->push_back(opt.param_owner(id));
      Hyperparams later;
      later.lr = 0.003;
      REQUIRE(opt.add_param_group(model.group(4, 6, later)) == 1);
      REQUIRE(opt.num_groups() == 2);
      if (owners_after) for (ParamId id = 0; id < 4; ++id) owners_after->push_back(opt.param_owner(id));
      for (int s = 2; s < 5; ++s) {
        for (ParamId id = 0; id < opt.num_params(); ++id) write_grad(opt, id, s);
        opt.step();
      }
      REQUIRE(opt.param_step(0) == 5);
      REQUIRE(opt.param_step(4) == 3);  // the new group started at step 0
      return all_params(opt);
    };
    std::vector<int> before, after;
    const auto sharded = run(world(), &before, &after);
    const auto single = run(solo(), nullptr, nullptr);
    REQUIRE(bitwise_equal(sharded, single));  // state carried across the re-layout
    if (partition == PartitionStrategy::sorted_greedy) REQUIRE(before == after);
  }
}

TEST_CASE("frozen params are not updated and take no state", "[zero]") {
  for (Storage storage : {Storage::bucket_view, Storage::external}) {
    auto run = [&](std::shared_ptr<Communicator> comm, MemoryReport* frozen_report) {
      Model model({40, 24, 40}, 23);
      model.external = storage == Storage::external;
      OptimizerConfig config;
      config.storage = storage;
      config.shard_state = true;
      ZeroOptimizer opt(comm, config, {model.group(0, 3, Hyperparams{})});
      opt.set_trainable(1, false);
      const std::vector<float> frozen_before(opt.param_view(1).as<float>(), opt.param_view(1).as<float>() + 24);
      for (int s = 0; s < 3; ++s) {
        for (ParamId id = 0; id < opt.num_params(); ++id) write_grad(opt, id, s);
        opt.step();
      }
      const std::vector<float> frozen_after(opt.param_view(1).as<float>(), opt.param_view(1).as<float>() + 24);
      REQUIRE(bitwise_equal(frozen_before, frozen_after));
      REQUIRE(opt.param_step(1) == 0);
      REQUIRE_FALSE(opt.trainable(1));
      if (frozen_report) *frozen_report = opt.memory_report();
      // Thawed, it trains again from fresh state.
      opt.set_trainable(1, true);
      for (ParamId id = 0; id < opt.num_params(); ++id) write_grad(opt, id, 9);
      opt.step();
      REQUIRE(opt.param_step(1) == 1);
      return all_params(opt);
    };
    MemoryReport report;
    const auto sharded = run(world(), &report);
    const int n = world()->size();
    REQUIRE(report.trainable_numel == 80);
    REQUIRE(report.state_bytes == 2 * 4 * (((80 + n - 1) / n + 15) / 16 * 16));
    REQUIRE(bitwise_equal(sharded, run(solo(), nullptr)));
  }
}

TEST_CASE("params without a gradient sit the step out: no update, no state or step change", "[zero]") {
  // Each param's update depends only on its own gradients, state and step count, so a param
  // that sits steps out must end as a one-param optimizer that never saw those steps.
  const std::vector<int64_t> sizes = {40, 24, 40, 9};
  const std::vector<ParamId> sitting_out = {1, 3};
  auto sits_out = [&](ParamId id, int s) { return (s == 1 || s == 2) && (id == 1 || id == 3); };
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage storage : {Storage::bucket_view, Storage::external}) {
        CAPTURE(algorithm_name(algorithm), partition_name(partition), static_cast<int>(storage));
        OptimizerConfig config;
        config.algorithm = algorithm;
        config.partition = partition;
        config.storage = storage;
        const Hyperparams hyper = shardopt_test::busy_hyperparams(algorithm);
        auto grad = [](ParamId id, int s, int64_t n) { return seeded_values(1000u + static_cast<uint32_t>(s * 97 + id), n); };
        auto fill = [](TensorRef g, const std::vector<float>& v) {
          if (g.numel > 0) std::memcpy(g.data, v.data(), g.nbytes());
        };

        Model model(sizes, 31);
        model.external = storage == Storage::external;
        ZeroOptimizer opt(world(), config, {model.group(0, sizes.size(), hyper)});
        std::vector<float> held;
        for (int s = 0; s < 5; ++s) {
          std::vector<ParamId> without;
          for (ParamId id = 0; id < opt.num_params(); ++id) {
            // A sitting-out param's buffer holds garbage: the step must not read it.
            fill(opt.grad_view(id), sits_out(id, s) ? std::vector<float>(static_cast<std::size_t>(sizes[static_cast<std::size_t>(id)]), 1e30f)
                                                    : grad(id, s, sizes[static_cast<std::size_t>(id)]));
            if (sits_out(id, s)) without.push_back(id);
          }
          if (s == 1) held.assign(opt.param_view(1).as<float>(), opt.param_view(1).as<float>() + 24);
          opt.step(without);
          if (s == 2) REQUIRE(bitwise_equal(held, std::vector<float>(opt.param_view(1).as<float>(), opt.param_view(1).as<float>() + 24)));
        }
        REQUIRE(opt.param_step(0) == 5);
        REQUIRE(opt.param_step(1) == 3);
        REQUIRE(opt.param_step(3) == 3);

        for (ParamId id = 0; id < opt.num_params(); ++id) {
          Model alone({sizes[static_cast<std::size_t>(id)]}, 31 + static_cast<uint32_t>(id));
          alone.external = model.external;
          ZeroOptimizer reference(solo(), config, {alone.group(0, 1, hyper)});
          for (int s = 0; s < 5; ++s) {
            if (sits_out(id, s)) continue;
            fill(reference.grad_view(0), grad(id, s, sizes[static_cast<std::size_t>(id)]));
            reference.step();
          }
          const TensorRef got = opt.param_view(id);
          REQUIRE(bitwise_equal(all_params(reference), std::vector<float>(got.as<float>(), got.as<float>() + got.numel)));
        }
      }
    }
  }
}

TEST_CASE("ranks naming different params without a gradient fail the step on every rank", "[zero]") {
  if (world()->size() < 2) return;
  Model model({10, 10}, 5);
  ZeroOptimizer opt(world(), OptimizerConfig{}, {model.group(0, 2, Hyperparams{})});
  std::vector<ParamId> without;
  if (world()->rank() == 1) without.push_back(1);
  const auto [code, what] = shardopt_test::error_of([&] { opt.step(without); });
  REQUIRE(code == ErrorCode::mismatch);
  REQUIRE_THAT(what, Catch::Contains("params without a gradient"));
  REQUIRE(opt.param_step(0) == 0);
  opt.step(std::vector<ParamId>{1});  // agreed: goes on
  REQUIRE(opt.param_step(0) == 1);
  REQUIRE(opt.param_step(1) == 0);
}

TEST_CASE("a subgroup communicator shards within the subgroup", "[zero]") {
  const int me = world()->rank();
  auto sub = world()->split(me % 2, me);
  // Different models per subgroup: params are identical inside a subgroup only.
  Model model({21, 8, 50}, 100u + static_cast<uint32_t>(me % 2));
  OptimizerConfig config;
  config.partition = PartitionStrategy::sorted_greedy;
  ZeroOptimizer opt(sub, config, {model.group(0, 3, Hyperparams{})});
  Model reference_model({21, 8, 50}, 100u + static_cast<uint32_t>(me % 2));
  ZeroOptimizer reference(solo(), config, {reference_model.group(0, 3, Hyperparams{})});
  for (int s = 0; s < 3; ++s) {
    for (ParamId id = 0; id < 3; ++id) {
      write_grad(opt, id, s + me % 2);
      write_grad(reference, id, s + me % 2);
    }
    opt.step();
    reference.step();
  }
  REQUIRE(bitwise_equal(all_params(opt), all_params(reference)));
  REQUIRE(opt.communicator().size() == sub->size());
}

TEST_CASE("fewer params than ranks leaves some shards empty, and still works", "[zero]") {
  for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
    auto run = [&](std::shared_ptr<Communicator> comm) {
      Model model({1, 2}, 77);
      OptimizerConfig config;
      config.partition = partition;
      ZeroOptimizer opt(comm, config, {model.group(0, 2, Hyperparams{})});
      for (int s = 0; s < 3; ++s) {
        for (ParamId id = 0; id < 2; ++id) write_grad(opt, id, s);
        opt.step();
      }
      if (partition == PartitionStrategy::sorted_greedy && comm->rank() >= 2) {
        REQUIRE(opt.memory_report().shard_numel == 0);
        REQUIRE(opt.memory_report().state_bytes == 0);
      }
      return all_params(opt);
    };
    REQUIRE(bitwise_equal(run(world()), run(solo())));
  }
}

TEST_CASE("reduce_gradients averages over ranks in every bucket", "[zero]") {
  const int n = world()->size(), me = world()->rank();
  for (Storage storage : {Storage::bucket_view, Storage::external}) {
    for (int64_t bucket_bytes : {int64_t{64}, int64_t{1} << 20}) {
      CAPTURE(static_cast<int>(storage), bucket_bytes);
      Model model({37, 5, 100}, 4);
      model.external = storage == Storage::external;
      OptimizerConfig config;
      config.storage = storage;
      config.bucket_bytes = bucket_bytes;
      ZeroOptimizer opt(world(), config, {model.group(0, 3, Hyperparams{})});
      for (ParamId id = 0; id < 3; ++id) {
        TensorRef g = opt.grad_view(id);
        // (rank+1) * (i % 8): integer sums, so the mean is exact.
        for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = static_cast<float>((me + 1) * (i % 8));
      }
      opt.reduce_gradients();
      const float mean_factor = static_cast<float>(n + 1) / 2.0f;
      for (ParamId id = 0; id < 3; ++id) {
        TensorRef g = opt.grad_view(id);
        for (int64_t i = 0; i < g.numel; ++i) REQUIRE(g.as<float>()[i] == mean_factor * static_cast<float>(i % 8));
      }
      opt.zero_grad();
      for (ParamId id = 0; id < 3; ++id) {
        TensorRef g = opt.grad_view(id);
        for (int64_t i = 0; i < g.numel; ++i) REQUIRE(g.as<float>()[i] == 0.f);
      }
    }
  }
}

TEST_CASE("bucket views are stable and filled with the initial values", "[zero]") {
  Model model({3, 4}, 8);
  ZeroOptimizer opt(world(), OptimizerConfig{}, {model.group(0, 2, Hyperparams{})});
  REQUIRE(opt.find_param("p1") == 1);
  REQUIRE(opt.param_name(0) == "p0");
  for (ParamId id = 0; id < 2; ++id) {
    TensorRef v = opt.param_view(id);
    REQUIRE(v.data != model.values[static_cast<std::size_t>(id)].data());  // shardopt's own buffer
    REQUIRE(std::vector<float>(v.as<float>(), v.as<float>() + v.numel) == model.values[static_cast<std::size_t>(id)]);
  }
  REQUIRE(opt.param_view(1).as<float>() == opt.param_view(0).as<float>() + 3);  // one flat buffer
}

TEST_CASE("a re-layout moves state even where a rank's shard is empty", "[zero]") {
  // sorted_greedy over more ranks than params: some ranks own nothing, yet must still join
  // every broadcast of the state migration that freezing a param triggers.
  for (Algorithm algorithm : {Algorithm::adam, Algorithm::sgd}) {
    CAPTURE(algorithm_name(algorithm));
    auto run = [&](std::shared_ptr<Communicator> comm) {
      Model model({8, 4}, 31);
      OptimizerConfig config;
      config.algorithm = algorithm;
      config.partition = PartitionStrategy::sorted_greedy;
      Hyperparams h = shardopt_test::busy_hyperparams(algorithm);
      ZeroOptimizer opt(comm, config, {model.group(0, 2, h)});
      for (int s = 0; s < 4; ++s) {
        if (s == 2) opt.set_trainable(1, false);
        for (ParamId id = 0; id < 2; ++id) write_grad(opt, id, s);
        opt.step();
      }
      return all_params(opt);
    };
    REQUIRE(bitwise_equal(run(world()), run(solo())));
  }
}
