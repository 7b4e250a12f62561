// tests/capi/test_capi_training_16bit.cpp — the C ABI with bf16/f16 parameters: steps bitwise the C++ API's, external bf16 buffers, DLPack and raw 16-bit tensors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capi_test_support.hpp"
#include "capi_training_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;
using namespace shardopt_capi_training_test;

// ---- bf16 / f16 parameters ------------------------------------------------------------------------

TEST_CASE("bf16 parameters step through the C ABI exactly as through the C++ API", "[capi][precision]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 200, 1};
  std::vector<std::vector<uint16_t>> initial;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint16_t> v;
    for (float f : shardopt_test::seeded_values(11u + static_cast<uint32_t>(i), sizes[i])) v.push_back(bf16_of(f));
    initial.push_back(v);
  }
  Model16 model(sizes, SHARDOPT_DTYPE_BF16, false, initial);

  bool stochastic = false;
  SECTION("round to nearest even") { stochastic = false; }
  SECTION("stochastic rounding, seeded") { stochastic = true; }

  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;  // several buckets
  config.stochastic_rounding = stochastic ? 1 : 0;
  config.rounding_seed = 1234;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  // The C++ reference with the same config, and one whose rounding differs (another seed, or
  // stochastic instead of nearest): the C config's fields must reach the optimizer.
  auto reference_config = [&](uint64_t seed, bool sr) {
    shardopt::OptimizerConfig c;
    c.algorithm = shardopt::Algorithm::adamw;
    c.bucket_bytes = 64;
    c.stochastic_rounding = sr;
    c.rounding_seed = seed;
    return c;
  };
  shardopt::ParamGroupSpec spec;
  spec.hyper.lr = 0.01;
  spec.hyper.weight_decay = 0.1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    spec.params.push_back(
        {model.names[i], {initial[i].data(), sizes[i], shardopt::DType::bf16, shardopt::Device::cpu()}, {}});
  }
  shardopt::ZeroOptimizer reference(shardopt_test::world(), reference_config(1234, stochastic), {spec});
  shardopt::ZeroOptimizer other(shardopt_test::world(), reference_config(stochastic ? 1235 : 1234, true), {spec});

  for (int step = 0; step < 3; ++step) {
    REQUIRE(shardopt_optimizer_zero_grad(opt) == SHARDOPT_OK);
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      const int64_t n = sizes[static_cast<std::size_t>(id)];
      std::vector<uint16_t> g;
      for (float f : shardopt_test::seeded_values(900u + static_cast<uint32_t>(31 * step + id), n)) {
        g.push_back(bf16_of(f));
      }
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      REQUIRE(view.dtype == SHARDOPT_DTYPE_BF16);
      REQUIRE(view.numel == n);
      std::memcpy(view.data, g.data(), g.size() * 2);
      std::memcpy(reference.grad_view(id).data, g.data(), g.size() * 2);
      std::memcpy(other.grad_view(id).data, g.data(), g.size() * 2);
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    for (shardopt::ZeroOptimizer* r : {&reference, &other}) {
      r->reduce_gradients();
      r->step();
    }
  }
  bool differs_from_other = false;
  int64_t moved = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &view) == SHARDOPT_OK);
    CHECK(view.dtype == SHARDOPT_DTYPE_BF16);
    const std::size_t bytes = static_cast<std::size_t>(view.numel) * 2;
    CHECK(std::memcmp(view.data, reference.param_view(id).data, bytes) == 0);
    differs_from_other = differs_from_other || std::memcmp(view.data, other.param_view(id).data, bytes) != 0;
    const uint16_t* now = static_cast<const uint16_t*>(view.data);
    for (int64_t i = 0; i < view.numel; ++i) moved += now[i] != initial[static_cast<std::size_t>(id)][static_cast<std::size_t>(i)];
  }
  // Three AdamW steps of about lr = 0.01 against bf16's 2^-8 relative spacing: most weights
  // moved (a few random-gradient steps may cancel out below half a bf16 spacing).
  CHECK(moved > 243 / 2);
  CHECK(differs_from_other);  // 243 elements, 3 steps: some rounding decision differs

  // The report's new fields, against the C++ API and the per-component rule: an fp32 master
  // copy and Adam's two moments for this rank's shard only.
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  const shardopt::MemoryReport expected = reference.memory_report();
  CHECK(report.state_bytes == expected.state_bytes);
  CHECK(report.master_bytes == expected.master_bytes);
  CHECK(report.param_bytes == expected.param_bytes);
  CHECK(report.grad_bytes == expected.grad_bytes);
  CHECK(report.buffer_bytes == expected.buffer_bytes);
  CHECK(report.param_buffer_bytes == expected.param_bytes);
  CHECK(report.grad_buffer_bytes == expected.grad_bytes + expected.buffer_bytes);
  CHECK(report.shard_numel == expected.shard_numel);
  CHECK(report.trainable_numel == 243);
  CHECK(report.master_bytes == 4 * report.shard_numel);
  CHECK(report.state_bytes == 8 * report.shard_numel);
  // The bf16 flat buffer (with the shards' alignment padding): this rank's own, or its node's.
  CHECK(report.param_bytes + report.node_shared_param_bytes >= 2 * 243);
  CHECK(report.node_shared_param_bytes == expected.node_shared_param_bytes);
  CHECK(report.node_ranks == (comm.size() > 1 ? comm.size() : 1));
  if (comm.size() > 1) CHECK(report.shard_numel < 243);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("bf16 external buffers: averaged gradients and SGD updates land in the caller's bf16 memory",
          "[capi][precision]") {
  CommHandle comm;
  const int world = comm.size();
  const std::vector<int64_t> sizes = {19, 4};
  std::vector<std::vector<uint16_t>> initial;
  for (int64_t n : sizes) initial.emplace_back(static_cast<std::size_t>(n), bf16_of(1.0f));
  Model16 model(sizes, SHARDOPT_DTYPE_BF16, true, initial);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.storage = SHARDOPT_STORAGE_EXTERNAL;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.5;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  // Rank r's gradient 0.25 (r + 1): the average 0.125 (world + 1) and every partial sum are exact
  // in bf16, and so is 1 - 0.5 * average for 1, 2 or 3 ranks.
  for (auto& g : model.grads) std::fill(g.begin(), g.end(), bf16_of(0.25f * static_cast<float>(comm.rank() + 1)));
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  const float average = 0.125f * static_cast<float>(world + 1);
  CHECK(float_of_bf16(model.grads[0][0]) == average);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  for (const auto& values : model.values) {
    for (uint16_t v : values) CHECK(float_of_bf16(v) == 1.0f - 0.5f * average);
  }
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("bf16 and f16 tensors are accepted through DLPack and raw; one optimizer takes one dtype",
          "[capi][precision]") {
  CommHandle comm;
  FakeTensor w({4, 2}), b({3});
  w.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 16, 1};
  b.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 16, 1};
  shardopt_param_desc params[2];
  shardopt_param_desc_init(&params[0]);
  params[0].name = "w";
  params[0].param_dlpack = &w.managed;
  shardopt_param_desc_init(&params[1]);
  params[1].name = "b";
  params[1].param_dlpack = &b.managed;
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = params;
  group.num_params = 2;
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  shardopt_tensor view{};
  REQUIRE(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_OK);
  CHECK(view.dtype == SHARDOPT_DTYPE_BF16);
  CHECK(view.numel == 8);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  CHECK(w.deletes == 1);
  CHECK(b.deletes == 1);

  // f16 with f32 in one optimizer: both valid dtypes, but an optimizer has one flat buffer.
  std::vector<uint16_t> half(4, f16_of(1.0f));
  std::vector<float> single(4, 1.0f);
  params[0] = shardopt_param_desc{};
  shardopt_param_desc_init(&params[0]);
  params[0].name = "half";
  params[0].param = cpu_tensor(half.data(), 4, SHARDOPT_DTYPE_F16);
  shardopt_param_desc_init(&params[1]);
  params[1].name = "single";
  params[1].param = cpu_tensor(single.data(), 4, SHARDOPT_DTYPE_F32);
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_ERR_UNSUPPORTED);
  CHECK(contains(last_error(), "all parameters of an optimizer share one dtype"));
  CHECK(opt == nullptr);
}
