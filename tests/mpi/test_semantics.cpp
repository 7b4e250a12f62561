// tests/mpi/test_semantics.cpp — torch's semantics: per-algorithm defaults, group inheritance, sorted_greedy owners with frozen params, bf16 masters re-seeded on load_state_dict, tiny buckets.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;

namespace {

// A short watchdog: a regression fails in seconds instead of hanging the job.
std::shared_ptr<Communicator> test_comm() { return mpi_world(CommOptions{10.0}); }

using Params = shardopt_test::SeededParams;

// The same gradients on every rank, so no reduction is needed for the ranks to agree.
void write_grads(ZeroOptimizer& opt, int step) {
  shardopt_test::write_seeded_grads(opt, 900u + static_cast<uint32_t>(step * 53));
}

// torch's ZeroRedundancyOptimizer._partition_parameters, written out independently: within
// each group in order, every param (trainable or not) sorted by numel descending (stable) goes
// to the rank with the smallest running total (the lowest such rank), totals carried across
// groups.
std::vector<int> torch_owners(const std::vector<std::vector<int64_t>>& groups, int world) {
  std::vector<int> owners;
  std::vector<int64_t> totals(static_cast<std::size_t>(world), 0);
  for (const auto& sizes : groups) {
    std::vector<std::size_t> order(sizes.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sizes[a] > sizes[b]; });
    std::vector<int> group_owners(sizes.size(), -1);
    for (std::size_t i : order) {
      const auto smallest = std::min_element(totals.begin(), totals.end());  // first of the minima
      group_owners[i] = static_cast<int>(smallest - totals.begin());
      *smallest += sizes[i];
    }
    owners.insert(owners.end(), group_owners.begin(), group_owners.end());
  }
  return owners;
}

std::vector<int> owners_of(const ZeroOptimizer& opt) {
  std::vector<int> owners;
  for (ParamId id = 0; id < opt.num_params(); ++id) owners.push_back(opt.param_owner(id));
  return owners;
}

}  // namespace

// ---- defaults ---------------------------------------------------------------------------------

TEST_CASE("AdamW's default weight_decay is 0.01 and Adam's and SGD's 0", "[semantics][defaults]") {
  CHECK(default_hyperparams(Algorithm::adamw).weight_decay == 0.01);
  CHECK(default_hyperparams(Algorithm::adam).weight_decay == 0.0);
  CHECK(default_hyperparams(Algorithm::sgd).weight_decay == 0.0);

  auto comm = test_comm();
  Params params({12, 20}, 3);
  for (Algorithm algorithm : {Algorithm::adamw, Algorithm::adam, Algorithm::sgd}) {
    CAPTURE(algorithm_name(algorithm));
    OptimizerConfig config;
    config.algorithm = algorithm;
    ZeroOptimizer opt(comm, config, {params.group(0, 2)});  // the group sets nothing
    const double expected = algorithm == Algorithm::adamw ? 0.01 : 0.0;
    CHECK(opt.hyperparams(0).weight_decay == expected);
    CHECK(opt.defaults().weight_decay == expected);
    CHECK(opt.hyperparams(0).lr == default_hyperparams(algorithm).lr);
  }
}

TEST_CASE("groups take the optimizer's defaults for what they leave unset at construction and in add_param_group",
          "[semantics][defaults]") {
  auto comm = test_comm();
  Params params({12, 20, 7}, 5);
  OptimizerConfig config;
  Hyperparams defaults;
  defaults.amsgrad = true;
  defaults.lr = 0.5;
  config.defaults = defaults;
  GroupHyperparams only_lr;
  only_lr.lr = 0.1;
  ZeroOptimizer opt(comm, config, {params.group(0, 2, only_lr)});
  CHECK(opt.hyperparams(0).lr == 0.1);
  CHECK(opt.hyperparams(0).amsgrad);
  CHECK(opt.defaults().lr == 0.5);
  CHECK(opt.defaults().amsgrad);
  REQUIRE(opt.add_param_group(params.group(2, 3, GroupHyperparams{})) == 1);
  CHECK(opt.hyperparams(1).lr == 0.5);
  CHECK(opt.hyperparams(1).amsgrad);
  CHECK(opt.hyperparams(1).beta2 == 0.999);
  // amsgrad from the defaults is live: the groups keep max_exp_avg_sq (three fp32 moments).
  write_grads(opt, 0);
  opt.step();
  CHECK(opt.param_step(2) == 1);
}

TEST_CASE("a group's hyperparams reference stays valid and live as groups are added", "[semantics][defaults]") {
  auto comm = test_comm();
  Params params({8, 8, 8, 8, 8}, 11);
  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.group(0, 1)});
  Hyperparams& first = opt.hyperparams(0);
  // Enough groups that a vector of groups would have reallocated under the reference.
  for (std::size_t i = 1; i < 5; ++i) opt.add_param_group(params.group(i, i + 1));
  first.lr = 0.25;
  CHECK(opt.hyperparams(0).lr == 0.25);
  CHECK(&opt.hyperparams(0) == &first);
  const float before = all_params(opt)[0];
  write_grads(opt, 0);
  opt.step();  // Adam's first step moves every element by about lr
  CHECK(std::fabs(all_params(opt)[0] - before) > 0.2f);
}

// ---- sorted_greedy owners, frozen params included ----------------------------------------------

TEST_CASE("sorted_greedy assigns owners as torch does with frozen params included at every world size",
          "[semantics][partition]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank();
  // Three groups; equal sizes within and across groups exercise the stable sort and the ties.
  const std::vector<std::vector<int64_t>> groups = {{5, 17, 3, 17, 40, 1, 9, 12}, {12, 30, 2, 7, 7}, {25, 4, 4}};
  std::vector<int64_t> sizes;
  for (const auto& g : groups) sizes.insert(sizes.end(), g.begin(), g.end());
  const std::vector<ParamId> frozen_at_start = {1, 4, 9};  // one of the 17s, the 40, the 30
  const ParamId frozen_later = 13;                         // the 25 in the added group

  // World sizes 1..n: the first w ranks form a group of w; the others one of n - w.
  for (int w = 1; w <= n; ++w) {
    auto sub = comm->split(me < w ? 0 : 1, me);
    const int world = sub->size();
    CAPTURE(world);
    Params params(sizes, 13);
    OptimizerConfig config;
    config.partition = PartitionStrategy::sorted_greedy;
    ZeroOptimizer opt(sub, config, {params.group(0, 8), params.group(8, 13)});
    const std::vector<int> two_groups = torch_owners({groups[0], groups[1]}, world);
    CHECK(owners_of(opt) == two_groups);

    for (ParamId id : frozen_at_start) opt.set_trainable(id, false);
    CHECK(owners_of(opt) == two_groups);  // freezing moves nothing

    REQUIRE(opt.add_param_group(params.group(13, 16)) == 2);
    const std::vector<int> all_groups = torch_owners(groups, world);
    CHECK(owners_of(opt) == all_groups);
    opt.set_trainable(frozen_later, false);
    CHECK(owners_of(opt) == all_groups);
    CHECK_FALSE(opt.trainable(frozen_later));

    // Adam state covers exactly the trainable params this rank owns.
    int64_t owned_trainable = 0;
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      if (opt.param_owner(id) == sub->rank() && opt.trainable(id)) owned_trainable += sizes[static_cast<std::size_t>(id)];
    }
    CHECK(opt.memory_report().state_bytes == 2 * 4 * owned_trainable);

    // Training leaves the frozen params and the owners alone.
    for (int s = 0; s < 2; ++s) {
      write_grads(opt, s);
      opt.step();
    }
    CHECK(owners_of(opt) == all_groups);
    for (ParamId id : {frozen_at_start[0], frozen_at_start[1], frozen_at_start[2], frozen_later}) {
      CAPTURE(id);
      const TensorRef v = opt.param_view(id);
      CHECK(bitwise_equal(std::vector<float>(v.as<float>(), v.as<float>() + v.numel), params.values[static_cast<std::size_t>(id)]));
      CHECK(opt.param_step(id) == 0);
    }
    CHECK(opt.param_step(0) == 2);
  }
}

TEST_CASE("the reference partition reproduces torch's documented case", "[semantics][partition]") {
  // torch's test_sharding: [9, 7, 5, 3] per rank over 4 ranks gives every rank 24 elements.
  std::vector<int64_t> sizes;
  for (int r = 0; r < 4; ++r) sizes.insert(sizes.end(), {9, 7, 5, 3});
  const std::vector<int> owners = torch_owners({sizes}, 4);
  std::vector<int64_t> totals(4, 0);
  for (std::size_t i = 0; i < sizes.size(); ++i) totals[static_cast<std::size_t>(owners[i])] += sizes[i];
  CHECK(totals == std::vector<int64_t>{24, 24, 24, 24});
  CHECK(torch_owners({{3, 3, 3}}, 2) == std::vector<int>{0, 1, 0});     // ties: the lowest rank
  CHECK(torch_owners({{1, 5}, {4}}, 2) == std::vector<int>{1, 0, 1});  // totals carry across groups
}

// ---- bf16 masters after load_state_dict -----------------------------------------------------------

namespace {

using Words = std::vector<uint16_t>;

Words to_bf16(const std::vector<float>& values) {
  Words out;
  for (float v : values) out.push_back(kernels::float_to_bf16(v));
  return out;
}

const std::vector<int64_t> kBf16Sizes = {24, 40, 9};

std::unique_ptr<ZeroOptimizer> make_bf16(std::shared_ptr<Communicator> comm, std::vector<Words>& init) {
  ParamGroupSpec g;
  for (std::size_t i = 0; i < kBf16Sizes.size(); ++i) {
    ParamSpec p;
    p.name = "w" + std::to_string(i);
    p.param = TensorRef{init[i].data(), kBf16Sizes[i], DType::bf16};
    g.params.push_back(p);
  }
  OptimizerConfig config;  // Adam, bucket view, flat
  config.bucket_bytes = 64;
  return std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{g});
}

std::vector<Words> seeded_bf16(uint32_t seed) {
  std::vector<Words> out;
  for (std::size_t i = 0; i < kBf16Sizes.size(); ++i) out.push_back(to_bf16(seeded_values(seed + static_cast<uint32_t>(i), kBf16Sizes[i], 3.0f)));
  return out;
}

std::vector<Words> filled_bf16(float value) {
  std::vector<Words> out;
  for (int64_t size : kBf16Sizes) out.emplace_back(static_cast<std::size_t>(size), kernels::float_to_bf16(value));
  return out;
}

void write_bf16_grads(ZeroOptimizer& opt, int step) {
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    TensorRef g = opt.grad_view(id);
    REQUIRE(g.dtype == DType::bf16);
    const Words words = to_bf16(seeded_values(700u + static_cast<uint32_t>(step * 17 + id), g.numel));
    std::memcpy(g.data, words.data(), g.nbytes());
  }
}

Words all_words(const ZeroOptimizer& opt) {
  Words out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    TensorRef v = opt.param_view(id);
    out.insert(out.end(), v.as<uint16_t>(), v.as<uint16_t>() + v.numel);
  }
  return out;
}

// torch's state_dict() exists only on the rank it was consolidated to: consolidate to each rank
// in turn so every rank holds the full dict.
StateDict state_dict_everywhere(ZeroOptimizer& opt) {
  StateDict mine;
  for (int r = 0; r < opt.communicator().size(); ++r) {
    opt.consolidate_state_dict(r);
    if (r == opt.communicator().rank()) mine = opt.state_dict();
  }
  return mine;
}

}  // namespace

TEST_CASE("bf16: a state dict without masters re-seeds them from the current parameter values", "[semantics][precision]") {
  auto comm = test_comm();
  SECTION("consolidated before the first step: the next step is a fresh optimizer's first") {
    std::vector<Words> initial = seeded_bf16(31);
    std::vector<Words> fresh_init = initial;
    auto fresh = make_bf16(comm, fresh_init);
    write_bf16_grads(*fresh, 0);
    fresh->step();

    std::vector<Words> zeros = filled_bf16(0.0f);
    auto restored = make_bf16(comm, zeros);
    const StateDict empty = state_dict_everywhere(*restored);
    CHECK(empty.state.empty());
    // The model's values arrive (as a model.load_state_dict would), then the optimizer's state.
    for (ParamId id = 0; id < restored->num_params(); ++id) {
      TensorRef v = restored->param_view(id);
      std::memcpy(v.data, initial[static_cast<std::size_t>(id)].data(), v.nbytes());
    }
    restored->load_state_dict(empty);
    write_bf16_grads(*restored, 0);
    restored->step();
    CHECK(all_words(*restored) == all_words(*fresh));
    // ...and they go on alike.
    write_bf16_grads(*fresh, 1);
    fresh->step();
    write_bf16_grads(*restored, 1);
    restored->step();
    CHECK(all_words(*restored) == all_words(*fresh));
  }
  SECTION("state with moments but no master: the step starts from the parameter, not from zero") {
    std::vector<Words> threes = filled_bf16(3.0f);
    auto trained = make_bf16(comm, threes);
    write_bf16_grads(*trained, 0);
    trained->step();
    StateDict sd = state_dict_everywhere(*trained);
    REQUIRE(sd.state.size() == kBf16Sizes.size());
    for (auto& [id, s] : sd.state) {
      CAPTURE(id);
      CHECK(s.tensors.count("exp_avg") == 1);
      CHECK(s.tensors.count("exp_avg_sq") == 1);
      s.tensors.erase("master");
    }
    std::vector<Words> threes_again = filled_bf16(3.0f);
    auto resumed = make_bf16(comm, threes_again);
    resumed->load_state_dict(sd);
    write_bf16_grads(*resumed, 1);
    resumed->step();
    // One Adam step moves a param by about lr = 1e-3; a zero-filled master would put it near 0.
    float farthest = 0.0f;
    for (uint16_t word : all_words(*resumed)) farthest = std::max(farthest, std::fabs(kernels::bf16_to_float(word) - 3.0f));
    CHECK(farthest < 0.05f);
  }
}

// ---- the flat partition's sync in many small buckets ----------------------------------------------

TEST_CASE("flat parameter sync in 64-byte buckets gives the bytes of the default bucket size", "[semantics][sync]") {
  auto comm = test_comm();
  const std::vector<int64_t> sizes = {13, 1, 64, 7, 100, 3, 31};
  for (Storage storage : {Storage::bucket_view, Storage::external}) {
    CAPTURE(static_cast<int>(storage));
    auto train = [&](int64_t bucket_bytes) {
      Params params(sizes, 77);
      OptimizerConfig config;
      config.algorithm = Algorithm::adam;
      config.partition = PartitionStrategy::flat;
      config.storage = storage;
      config.bucket_bytes = bucket_bytes;
      Hyperparams h = shardopt_test::busy_hyperparams(Algorithm::adam);
      ZeroOptimizer opt(comm, config, {params.group(0, sizes.size(), h, storage == Storage::external)});
      for (int s = 0; s < 4; ++s) {
        write_grads(opt, s);
        opt.step();
      }
      return all_params(opt);
    };
    const auto start = std::chrono::steady_clock::now();
    const auto tiny = train(64);
    const auto standard = train(OptimizerConfig{}.bucket_bytes);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 8.0);
    CHECK(bitwise_equal(tiny, standard));
    std::vector<float> initial;
    for (const auto& v : Params(sizes, 77).values) initial.insert(initial.end(), v.begin(), v.end());
    CHECK_FALSE(bitwise_equal(tiny, initial));  // training moved the params at all
  }
}
