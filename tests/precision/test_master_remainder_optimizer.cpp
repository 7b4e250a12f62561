// tests/precision/test_master_remainder_optimizer.cpp — master = remainder16 through the optimizer: masters bitwise those of fp32 masters over 1,000 steps, N ranks equal 1 rank, memory, checkpoints, refusals.
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mixed_update.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

// Odd sizes that straddle shard and bucket boundaries; two groups.
const std::vector<int64_t> kSizes = {1, 37, 1000, 4099, 16, 3};

using Bits = std::vector<uint16_t>;

// The parameter the remainder path holds for master m: nearest-even but at exact ties.
uint16_t expected_param(float m) {
  const uint32_t u = kernels::float_bits(m);
  const bool tie = (u & 0xffffu) == 0x8000u && ((u >> 16) & 1u) == 0u;
  return tie ? static_cast<uint16_t>((u >> 16) + 1u) : kernels::float_to_bf16(m);
}

struct Setup {
  std::shared_ptr<Communicator> comm;
  MasterStorage master = MasterStorage::fp32;           // config.master
  std::optional<MasterStorage> group1_master;           // group 1's own setting
  Algorithm algorithm = Algorithm::adamw;
  PartitionStrategy partition = PartitionStrategy::flat;
  int stage = 1;
};

Setup setup(std::shared_ptr<Communicator> comm, MasterStorage master = MasterStorage::fp32) {
  Setup s;
  s.comm = std::move(comm);
  s.master = master;
  return s;
}

std::unique_ptr<ZeroOptimizer> make(const Setup& s) {
  OptimizerConfig config;
  config.algorithm = s.algorithm;
  config.partition = s.partition;
  config.stage = s.stage;
  config.master = s.master;
  config.bucket_bytes = 512;
  std::vector<ParamGroupSpec> groups(2);
  std::vector<Bits> init(kSizes.size());
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    for (float v : shardopt_test::seeded_values(static_cast<uint32_t>(100 + i), kSizes[i])) {
      init[i].push_back(kernels::float_to_bf16(v));
    }
    groups[i % 2].params.push_back(
        ParamSpec{"p" + std::to_string(i), TensorRef{init[i].data(), kSizes[i], DType::bf16, Device::cpu()}, TensorRef{}});
  }
  groups[0].hyper = shardopt_test::busy_hyperparams(s.algorithm);
  groups[1].hyper = shardopt_test::busy_hyperparams(s.algorithm);
  groups[0].hyper.lr = 1e-3;  // steps below a bf16 spacing: only the masters keep them
  groups[1].settings.master = s.group1_master;
  return std::make_unique<ZeroOptimizer>(s.comm, config, groups);
}

// Gradients on a coarse grid (exact sums over up to 4 ranks), the same on every rank.
void feed(ZeroOptimizer& opt, int step, int stage) {
  opt.zero_grad();
  for (std::size_t j = kSizes.size(); j-- > 0;) {
    const std::vector<float> g = shardopt_test::seeded_values(static_cast<uint32_t>(1000 * step + j), kSizes[j]);
    Bits words;
    for (float v : g) words.push_back(kernels::float_to_bf16(static_cast<float>(static_cast<int>(v * 16.f)) / 128.f));
    const ParamId id = opt.find_param("p" + std::to_string(j));
    if (stage == 2) {
      opt.reduce_gradient(id, TensorRef{words.data(), kSizes[j], DType::bf16, Device::cpu()});
    } else {
      std::memcpy(opt.grad_view(id).data, words.data(), words.size() * 2);
    }
  }
  opt.reduce_gradients();
  opt.step();
}

std::vector<Bits> params_of(const ZeroOptimizer& opt) {
  std::vector<Bits> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = opt.param_view(id);
    const auto* h = static_cast<const uint16_t*>(v.data);
    out.emplace_back(h, h + v.numel);
  }
  return out;
}

// Every param's fp32 master, consolidated on rank 0 (empty elsewhere).
std::vector<std::vector<float>> masters_of(ZeroOptimizer& opt) {
  opt.consolidate_state_dict(0);
  std::vector<std::vector<float>> out;
  if (opt.communicator().rank() != 0) return out;
  const StateDict sd = opt.state_dict();
  for (ParamId id = 0; id < opt.num_params(); ++id) out.push_back(sd.state.at(id).tensors.at("master"));
  return out;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("remainder16: 1,000 steps keep the fp32 master's bits; parameters differ only at exact ties",
          "[remainder]") {
  Setup fp32 = setup(world());
  Setup rem = setup(world(), MasterStorage::remainder16);
  auto reference = make(fp32);
  auto compact = make(rem);
  int64_t ties = 0;
  for (int step = 0; step < 1000; ++step) {
    feed(*reference, step, 1);
    feed(*compact, step, 1);
    // Every step: the parameters are equal, or one bf16 unit larger at a tie (an even pattern).
    const std::vector<Bits> a = params_of(*reference), b = params_of(*compact);
    for (std::size_t i = 0; i < a.size(); ++i) {
      for (std::size_t e = 0; e < a[i].size(); ++e) {
        if (a[i][e] == b[i][e]) continue;
        ++ties;
        if (b[i][e] != a[i][e] + 1 || (a[i][e] & 1u) != 0) {
          FAIL("step " << step << " param " << i << " element " << e << ": " << b[i][e] << " vs " << a[i][e]);
        }
      }
    }
    if ((step + 1) % 100 != 0) continue;
    const auto ma = masters_of(*reference), mb = masters_of(*compact);
    REQUIRE(same_bits(ma, mb));
    for (std::size_t i = 0; i < mb.size(); ++i) {
      for (std::size_t e = 0; e < mb[i].size(); ++e) {
        if (b[i][e] != expected_param(mb[i][e])) FAIL("param " << i << " element " << e << " is not its master's");
      }
    }
  }
  INFO("elements one unit apart at exact ties over 1,000 steps: " << ties);
  // The run moved the parameters at all.
  auto untouched = make(rem);
  REQUIRE(params_of(*untouched) != params_of(*compact));
}

TEST_CASE("remainder16: N ranks give one rank's bits, stage 1 and 2, per-group settings", "[remainder]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      CAPTURE(stage, partition_name(partition));
      Setup s = setup(world(), MasterStorage::remainder16);
      s.stage = stage;
      s.partition = partition;
      s.algorithm = stage == 1 ? Algorithm::adamw : Algorithm::sgd;
      Setup mixed = s;
      mixed.master = MasterStorage::fp32;
      mixed.group1_master = MasterStorage::remainder16;  // group 0 fp32 masters, group 1 remainders
      auto sharded = make(s);
      auto mixed_sharded = make(mixed);
      Setup one = s;
      one.comm = solo();
      auto single = make(one);
      for (int step = 0; step < 30; ++step) {
        feed(*sharded, step, stage);
        feed(*mixed_sharded, step, stage);
        feed(*single, step, stage);
      }
      REQUIRE(params_of(*sharded) == params_of(*single));
      const auto m_sharded = masters_of(*sharded), m_mixed = masters_of(*mixed_sharded);
      REQUIRE(same_bits(m_sharded, m_mixed));
    }
  }
}

TEST_CASE("remainder16: memory_report counts 2 master bytes per shard element", "[remainder][memory]") {
  for (auto [master, group1, per_element] :
       {std::tuple{MasterStorage::fp32, std::optional<MasterStorage>{}, 4},
        std::tuple{MasterStorage::remainder16, std::optional<MasterStorage>{}, 2},
        // Mixed groups keep both arrays over the shard (each group uses its own).
        std::tuple{MasterStorage::fp32, std::optional<MasterStorage>{MasterStorage::remainder16}, 6}}) {
    Setup s = setup(world(), master);
    s.group1_master = group1;
    auto opt = make(s);
    const MemoryReport r = opt->memory_report();
    CAPTURE(master_storage_name(master), per_element);
    CHECK(r.master_bytes == per_element * r.shard_numel);
    // A save materialises fp32 masters until the next step, which drops them again.
    const std::string dir = fmt::format("{}/remainder_np{}/memory", SHARDOPT_TEST_SCRATCH, world()->size());
    opt->save(dir);
    feed(*opt, 0, 1);
    CHECK(opt->memory_report().master_bytes == per_element * r.shard_numel);
  }
}

TEST_CASE("remainder16: checkpoints carry fp32 masters and resume bitwise, across master storages",
          "[remainder][checkpoint]") {
  const std::string dir = fmt::format("{}/remainder_np{}/resume", SHARDOPT_TEST_SCRATCH, world()->size());
  Setup rem = setup(world(), MasterStorage::remainder16);
  Setup fp32 = setup(world());
  auto straight = make(rem);
  auto straight_fp32 = make(fp32);
  for (int step = 0; step < 12; ++step) {
    feed(*straight, step, 1);
    feed(*straight_fp32, step, 1);
  }
  for (MasterStorage saved_by : {MasterStorage::remainder16, MasterStorage::fp32}) {
    CAPTURE(master_storage_name(saved_by));
    auto first = make(setup(world(), saved_by));
    for (int step = 0; step < 6; ++step) feed(*first, step, 1);
    first->save(dir);
    // Resumed with remainders at another partition (and, against a solo run, another world).
    Setup resume = setup(world(), MasterStorage::remainder16);
    resume.partition = PartitionStrategy::sorted_greedy;
    auto resumed = make(resume);
    resumed->load(dir);
    for (int step = 6; step < 12; ++step) feed(*resumed, step, 1);
    REQUIRE(same_bits(masters_of(*resumed), masters_of(*straight_fp32)));
    REQUIRE(params_of(*resumed) == params_of(*straight));
  }
}

TEST_CASE("remainder16 refuses what cannot combine, by name on every rank", "[remainder][errors]") {
  std::vector<uint16_t> h(8);
  std::vector<float> f(8);
  auto group_of = [&](DType dtype) {
    ParamGroupSpec g;
    g.params.push_back(ParamSpec{"w", TensorRef{dtype == DType::f32 ? static_cast<void*>(f.data()) : h.data(), 8, dtype,
                                                Device::cpu()},
                                 TensorRef{}});
    return g;
  };
  OptimizerConfig config;
  config.master = MasterStorage::remainder16;
  SECTION("stochastic rounding") {
    config.stochastic_rounding = true;
    const auto [code, message] = error_of([&] { ZeroOptimizer(world(), config, {group_of(DType::bf16)}); });
    CHECK(code == ErrorCode::invalid_argument);
    CHECK_THAT(message, Catch::Contains("param group 0: master = remainder16 cannot combine with config.stochastic_rounding"));
  }
  SECTION("f32 and f16 parameters") {
    for (DType dtype : {DType::f32, DType::f16}) {
      const auto [code, message] = error_of([&] { ZeroOptimizer(world(), config, {group_of(dtype)}); });
      CHECK(code == ErrorCode::invalid_argument);
      CHECK_THAT(message, Catch::Contains("master = remainder16 needs bf16 parameters, but parameter 'w' is " +
                                          std::string(dtype_name(dtype))));
    }
  }
  SECTION("a group's setting in add_param_group") {
    ZeroOptimizer opt(world(), OptimizerConfig{}, {group_of(DType::bf16)});
    ParamGroupSpec more = group_of(DType::bf16);
    more.params[0].name = "v";
    more.settings.master = MasterStorage::remainder16;
    more.settings.state_precision = StatePrecision::q8;
    const auto [code, message] = error_of([&] { opt.add_param_group(more); });
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("param group 1: state_precision = q8"));
    more.settings.state_precision.reset();
    REQUIRE(opt.add_param_group(more) == 1);
    CHECK(opt.memory_report().master_bytes == 6 * opt.memory_report().shard_numel);
  }
  SECTION("ranks that disagree") {
    if (world()->size() > 1) {
      OptimizerConfig mine;
      if (world()->rank() == 1) mine.master = MasterStorage::remainder16;
      const auto [code, message] = error_of([&] { ZeroOptimizer(world(), mine, {group_of(DType::bf16)}); });
      CHECK(code == ErrorCode::mismatch);
      CHECK_THAT(message, Catch::Contains("config.master"));
      ParamGroupSpec g = group_of(DType::bf16);
      if (world()->rank() == 1) g.settings.master = MasterStorage::remainder16;
      const auto [code2, message2] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {g}); });
      CHECK(code2 == ErrorCode::mismatch);
      CHECK_THAT(message2, Catch::Contains("param group 0 master"));
    }
  }
  SECTION("model averaging") {
    ZeroOptimizer opt(world(), config, {group_of(DType::bf16)});
    const auto [code, message] = error_of([&] { ModelAverager(world(), opt, periodic_averager(2)); });
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("master = remainder16"));
  }
}
