// tests/precision/test_q8_optimizer.cpp — state_precision = q8 through the optimizer: the kernel's bits, N ranks equal 1 rank, 8-bit params below 2.1 state bytes per element, refusals by name on every rank, layout changes carrying 8-bit state.
#include <catch2/catch.hpp>

#include <cstring>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpu/update_cpu.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "q8_state.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::param_bytes;
using shardopt_test::world;

std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

// 8-bit params (4096 exactly, a partial last block, several blocks) beside ones under
// min_8bit_size that keep fp32 moments, in a q8 group and an fp32 one.
const std::vector<int64_t> kSizes = {5000, 300, 4096, 8200, 17, 4500};

struct Setup {
  std::shared_ptr<Communicator> comm;
  DType dtype = DType::f32;
  MasterStorage master = MasterStorage::fp32;
  int stage = 1;
  bool shard_state = true;
  bool group1_fp32 = false;  // group 1 keeps fp32 moments whatever its sizes
};

Setup setup(std::shared_ptr<Communicator> comm) {
  Setup s;
  s.comm = std::move(comm);
  return s;
}

std::vector<uint16_t> narrow_all(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x));
  return out;
}

std::unique_ptr<ZeroOptimizer> make(const Setup& s, const std::vector<int64_t>& sizes = kSizes) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = PartitionStrategy::sorted_greedy;
  config.stage = s.stage;
  config.shard_state = s.shard_state;
  config.master = s.master;
  config.state_precision = StatePrecision::q8;
  std::vector<ParamGroupSpec> groups(2);
  std::vector<std::vector<char>> init(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<float> values = shardopt_test::seeded_values(static_cast<uint32_t>(40 + i), sizes[i]);
    init[i].resize(values.size() * dtype_size(s.dtype));
    if (s.dtype == DType::f32) std::memcpy(init[i].data(), values.data(), init[i].size());
    else std::memcpy(init[i].data(), narrow_all(values, s.dtype).data(), init[i].size());
    groups[i % 2].params.push_back(
        ParamSpec{"q" + std::to_string(i), TensorRef{init[i].data(), sizes[i], s.dtype, Device::cpu()}, TensorRef{}});
  }
  groups[0].hyper.lr = 1e-2;
  groups[0].hyper.weight_decay = 0.01;
  groups[1].hyper.lr = 3e-3;
  groups[1].hyper.beta2 = 0.99;
  if (s.group1_fp32) groups[1].settings.state_precision = StatePrecision::fp32;
  return std::make_unique<ZeroOptimizer>(s.comm, config, groups);
}

// Gradients on a power-of-two grid per parameter (sums and averages over up to 4 ranks exact).
std::vector<float> grads_of(int step, std::size_t param, int64_t n) {
  std::vector<float> g = shardopt_test::seeded_values(static_cast<uint32_t>(500 * step + param), n);
  const float scale = std::ldexp(1.f, -static_cast<int>(param % 5) * 3);
  for (float& v : g) v = static_cast<float>(static_cast<int>(v * 16.f)) / 128.f * scale;
  return g;
}

void feed(ZeroOptimizer& opt, int step, const Setup& s) {
  opt.zero_grad();
  for (std::size_t j = static_cast<std::size_t>(opt.num_params()); j-- > 0;) {
    const ParamId id = opt.find_param("q" + std::to_string(j));
    if (!opt.trainable(id)) continue;
    const TensorRef view = opt.param_view(id);
    const std::vector<float> g = grads_of(step, j, view.numel);
    std::vector<char> bytes(g.size() * dtype_size(s.dtype));
    if (s.dtype == DType::f32) std::memcpy(bytes.data(), g.data(), bytes.size());
    else std::memcpy(bytes.data(), narrow_all(g, s.dtype).data(), bytes.size());
    if (s.stage == 2) {
      opt.reduce_gradient(id, TensorRef{bytes.data(), view.numel, s.dtype, Device::cpu()});
    } else {
      std::memcpy(opt.grad_view(id).data, bytes.data(), bytes.size());
    }
  }
  opt.reduce_gradients();
  opt.step();
}

}  // namespace

TEST_CASE("q8: the optimizer's step is the fused kernel's, and small params keep fp32 moments", "[q8]") {
  // One rank, f32: param q0 (5000 elements) against the kernel on copies, step by step.
  Setup s = setup(solo());
  auto opt = make(s);
  const ParamId id = opt->find_param("q0");
  const int64_t n = opt->param_view(id).numel;
  std::vector<float> param(static_cast<std::size_t>(n));
  std::memcpy(param.data(), opt->param_view(id).data, param.size() * 4);
  std::vector<uint8_t> c1(param.size(), 0), c2(param.size(), 0);
  std::vector<float> a1(static_cast<std::size_t>(kernels::q8_blocks(n)), 0.f), a2(a1);
  // Param q1 (300 elements, under min_8bit_size) against an optimizer whose groups keep fp32.
  Setup plain = s;
  plain.group1_fp32 = true;
  auto reference = make(plain);
  for (int step = 0; step < 6; ++step) {
    feed(*opt, step, s);
    feed(*reference, step, plain);
    const std::vector<float> g = grads_of(step, 0, n);
    const kernels::AdamScalars sc = kernels::make_adam_scalars(1e-2, 0.9, 0.999, 1e-8, 0.01, true, false, false, step + 1);
    kernels::adam_update_q8_cpu(kernels::UpdateTensors{param.data(), g.data(), nullptr, DType::f32},
                                kernels::Q8Moments{c1.data(), c2.data(), a1.data(), a2.data()}, n, sc, {}, {}, 1);
    REQUIRE(std::memcmp(param.data(), opt->param_view(id).data, param.size() * 4) == 0);
    const TensorRef small = opt->param_view(opt->find_param("q1"));
    REQUIRE(std::memcmp(small.data, reference->param_view(reference->find_param("q1")).data, 300 * 4) == 0);
  }
  // The 8-bit group's large params differ from fp32 moments' results (the state is quantised).
  REQUIRE(std::memcmp(opt->param_view(opt->find_param("q3")).data,
                      reference->param_view(reference->find_param("q3")).data, 8200 * 4) != 0);
}

TEST_CASE("q8: N ranks give one rank's bits: f32, bf16 with fp32 masters and remainders, stage 1 and 2, unsharded",
          "[q8]") {
  struct Variant {
    DType dtype;
    MasterStorage master;
    int stage;
    bool shard_state;
  };
  for (const Variant& v : {Variant{DType::f32, MasterStorage::fp32, 1, true}, Variant{DType::bf16, MasterStorage::fp32, 2, true},
                           Variant{DType::bf16, MasterStorage::remainder16, 1, true},
                           Variant{DType::f16, MasterStorage::fp32, 1, false}}) {
    CAPTURE(dtype_name(v.dtype), master_storage_name(v.master), v.stage, v.shard_state);
    Setup s = setup(world());
    s.dtype = v.dtype;
    s.master = v.master;
    s.stage = v.stage;
    s.shard_state = v.shard_state;
    Setup one = s;
    one.comm = solo();
    auto sharded = make(s);
    auto single = make(one);
    for (int step = 0; step < 20; ++step) {
      feed(*sharded, step, s);
      feed(*single, step, one);
    }
    REQUIRE(param_bytes(*sharded) == param_bytes(*single));
    auto untouched = make(one);
    REQUIRE(param_bytes(*untouched) != param_bytes(*single));
  }
}

// Param j's values as stored (dtype bytes).
std::vector<uint8_t> value_bytes(ZeroOptimizer& opt, std::size_t j) {
  const ParamId id = opt.find_param("q" + std::to_string(j));
  opt.wait_param(id);
  const TensorRef v = opt.param_view(id);
  const auto* p = static_cast<const uint8_t*>(v.data);
  return std::vector<uint8_t>(p, p + v.nbytes());
}

TEST_CASE("q8: set_trainable and add_param_group carry each 8-bit param's codes and absmax to its new place",
          "[q8][layout]") {
  // `changed` freezes q2, unfreezes it, and gains a group (an 8-bit q6 and a small q7) while
  // `steady` trains on: every param the changes leave alone must keep stepping bitwise as in
  // `steady`, whichever rank it moves to; q6 as in an optimizer of its group alone; and the
  // whole run on N ranks as on one.
  struct Variant {
    DType dtype;
    MasterStorage master;
    int stage;
  };
  for (const Variant& v : {Variant{DType::f32, MasterStorage::fp32, 1}, Variant{DType::bf16, MasterStorage::remainder16, 2}}) {
    CAPTURE(dtype_name(v.dtype), master_storage_name(v.master), v.stage);
    auto run = [&](std::shared_ptr<Communicator> comm, std::vector<std::vector<uint8_t>>& values) {
      Setup s = setup(std::move(comm));
      s.dtype = v.dtype;
      s.master = v.master;
      s.stage = v.stage;
      auto steady = make(s);
      auto changed = make(s);
      auto compare_untouched = [&] {
        for (std::size_t j = 0; j < kSizes.size(); ++j) {
          CAPTURE(j);
          if (j != 2) REQUIRE(value_bytes(*changed, j) == value_bytes(*steady, j));
        }
      };
      for (int step = 0; step < 3; ++step) {
        feed(*steady, step, s);
        feed(*changed, step, s);
      }
      const std::vector<uint8_t> q2_frozen = value_bytes(*changed, 2);
      changed->set_trainable(changed->find_param("q2"), false);
      for (int step = 3; step < 5; ++step) {
        feed(*steady, step, s);
        feed(*changed, step, s);
      }
      compare_untouched();
      REQUIRE(value_bytes(*changed, 2) == q2_frozen);
      changed->set_trainable(changed->find_param("q2"), true);
      // A group of an 8-bit param and a small one, and the same group alone in its own optimizer.
      const std::vector<int64_t> added = {6000, 40};
      std::vector<std::vector<char>> init;
      ParamGroupSpec group;
      group.hyper.lr = 5e-3;
      for (std::size_t i = 0; i < added.size(); ++i) {
        const std::vector<float> values = shardopt_test::seeded_values(static_cast<uint32_t>(70 + i), added[i]);
        init.emplace_back(values.size() * dtype_size(s.dtype));
        if (s.dtype == DType::f32) std::memcpy(init.back().data(), values.data(), init.back().size());
        else std::memcpy(init.back().data(), narrow_all(values, s.dtype).data(), init.back().size());
        group.params.push_back(ParamSpec{"q" + std::to_string(kSizes.size() + i),
                                         TensorRef{init.back().data(), added[i], s.dtype, Device::cpu()}, TensorRef{}});
      }
      changed->add_param_group(group);
      OptimizerConfig alone_config = changed->config();
      ZeroOptimizer alone(s.comm, alone_config, {group});
      for (int step = 5; step < 8; ++step) {
        feed(*steady, step, s);
        feed(*changed, step, s);
        // `alone` holds q6 and q7 as its params 0 and 1: the same gradients by name.
        alone.zero_grad();
        for (std::size_t i = added.size(); i-- > 0;) {
          const ParamId id = alone.find_param("q" + std::to_string(kSizes.size() + i));
          const std::vector<float> g = grads_of(step, kSizes.size() + i, added[i]);
          std::vector<char> bytes(g.size() * dtype_size(s.dtype));
          if (s.dtype == DType::f32) std::memcpy(bytes.data(), g.data(), bytes.size());
          else std::memcpy(bytes.data(), narrow_all(g, s.dtype).data(), bytes.size());
          if (s.stage == 2) {
            alone.reduce_gradient(id, TensorRef{bytes.data(), added[i], s.dtype, Device::cpu()});
          } else {
            std::memcpy(alone.grad_view(id).data, bytes.data(), bytes.size());
          }
        }
        alone.reduce_gradients();
        alone.step();
      }
      compare_untouched();
      for (std::size_t i = 0; i < added.size(); ++i) {
        const ParamId id = alone.find_param("q" + std::to_string(kSizes.size() + i));
        alone.wait_param(id);
        const TensorRef view = alone.param_view(id);
        const auto* p = static_cast<const uint8_t*>(view.data);
        REQUIRE(value_bytes(*changed, kSizes.size() + i) == std::vector<uint8_t>(p, p + view.nbytes()));
      }
      std::vector<std::vector<uint8_t>> all;
      for (std::size_t j = 0; j < kSizes.size() + added.size(); ++j) all.push_back(value_bytes(*changed, j));
      values = all;
    };
    std::vector<std::vector<uint8_t>> on_world, on_one;
    run(world(), on_world);
    run(solo(), on_one);
    REQUIRE(on_world == on_one);
  }
}

TEST_CASE("q8: memory_report counts 2 bytes and an absmax per block for 8-bit params, fp32 moments for the rest",
          "[q8][memory]") {
  const std::vector<int64_t> sizes = {int64_t{1} << 16, 300};
  auto opt = make(setup(world()), sizes);
  const MemoryReport r = opt->memory_report();
  const int me = world()->rank();
  int64_t expected = 0;
  bool holds_q8 = false;
  for (ParamId id = 0; id < 2; ++id) holds_q8 = holds_q8 || (opt->param_owner(id) == me && sizes[static_cast<std::size_t>(id)] >= 4096);
  if (opt->param_owner(0) == me) expected += 2 * sizes[0] + 2 * 4 * kernels::q8_blocks(sizes[0]);
  // fp32 moments: packed over the small params where 8-bit ones share the shard, else the shard.
  if (opt->param_owner(1) == me) expected += holds_q8 ? 8 * sizes[1] : 8 * r.shard_numel;
  CHECK(r.state_bytes == expected);
  if (opt->param_owner(0) == me) {
    const double per_element = static_cast<double>(2 * sizes[0] + 8 * kernels::q8_blocks(sizes[0])) / static_cast<double>(sizes[0]);
    CHECK(per_element <= 2.1);
  }
}

TEST_CASE("q8 refuses what cannot combine, by name on every rank", "[q8][errors]") {
  std::vector<float> w(5000);
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"w", TensorRef{w.data(), 5000, DType::f32, Device::cpu()}, TensorRef{}});
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = PartitionStrategy::sorted_greedy;
  config.state_precision = StatePrecision::q8;
  auto refusal = [&](const OptimizerConfig& c, const ParamGroupSpec& g) {
    return error_of([&] { ZeroOptimizer(world(), c, {g}); });
  };
  SECTION("configurations that would cut blocks or need fp32 state") {
    OptimizerConfig flat = config;
    flat.partition = PartitionStrategy::flat;
    CHECK_THAT(refusal(flat, group).second, Catch::Contains("param group 0: state_precision = q8") &&
                                                Catch::Contains("needs partition = sorted_greedy"));
    OptimizerConfig sgd = config;
    sgd.algorithm = Algorithm::sgd;
    CHECK_THAT(refusal(sgd, group).second, Catch::Contains("implemented for adam and adamw"));
    OptimizerConfig chunks = config;
    chunks.pipeline_chunk_bytes = 4096;
    CHECK_THAT(refusal(chunks, group).second, Catch::Contains("cannot combine with pipeline_chunk_bytes"));
    ParamGroupSpec ams = group;
    ams.hyper.amsgrad = true;
    const auto [code, message] = refusal(config, ams);
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("cannot combine with amsgrad"));
  }
  SECTION("a group's own algorithm decides: Muon keeps fp32 momentum and fp32 masters") {
    ParamGroupSpec muon = group;
    muon.params[0].shape = {50, 100};
    muon.settings.algorithm = Algorithm::muon;
    const auto [code, message] = refusal(config, muon);
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("param group 0: state_precision = q8") &&
                            Catch::Contains("implemented for adam and adamw; this group runs muon"));
    OptimizerConfig remainder = config;
    remainder.state_precision = StatePrecision::fp32;
    remainder.master = MasterStorage::remainder16;
    const auto [remainder_code, remainder_message] = refusal(remainder, muon);
    CHECK(remainder_code == ErrorCode::unsupported);
    CHECK_THAT(remainder_message, Catch::Contains("master = remainder16 is not implemented for muon"));
  }
  SECTION("amsgrad switched on later") {
    ZeroOptimizer opt(world(), config, {group});
    opt.hyperparams(0).amsgrad = true;
    const auto [code, message] = error_of([&] { opt.step(); });
    CHECK(code == ErrorCode::invalid_argument);
    CHECK_THAT(message, Catch::Contains("amsgrad cannot be switched on for state_precision = q8"));
    // Nothing moved: switched off again, the optimizer steps.
    opt.hyperparams(0).amsgrad = false;
    opt.step();
    CHECK(opt.param_step(0) == 1);
  }
}
