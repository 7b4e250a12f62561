// tests/capi/test_capi_training_stage2.cpp — the C ABI's ZeRO-2: reduce_gradient round trips bitwise stage 1, and its refusals as statuses with messages.
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

// ---- stage 2 --------------------------------------------------------------------------------------

TEST_CASE("stage 2: gradients handed with reduce_gradient give the stage-1 steps bitwise", "[capi][stage2]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 128, 1};
  Model32 model1(sizes), model2(sizes);
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;  // 16 elements: parameters span buckets, buckets span parameters
  const shardopt_param_group_desc group1 = model1.group(&hyper);
  shardopt_optimizer_t stage1 = create(comm, config, group1);
  config.stage = 2;
  const shardopt_param_group_desc group2 = model2.group(&hyper);
  shardopt_optimizer_t stage2 = create(comm, config, group2);

  // p2 is handed as a DLPack tensor, consumed by each successful call.
  FakeTensor dl({128});
  for (int step = 0; step < 3; ++step) {
    REQUIRE(shardopt_optimizer_zero_grad(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_zero_grad(stage2) == SHARDOPT_OK);
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      const int64_t n = sizes[static_cast<std::size_t>(id)];
      std::vector<float> g(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = exact_grad(id, step, i, comm.rank());
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(stage1, id, &view) == SHARDOPT_OK);
      std::memcpy(view.data, g.data(), g.size() * sizeof(float));
      if (id == 2) {
        std::copy(g.begin(), g.end(), dl.storage.begin());
        const int before = dl.deletes;
        REQUIRE(shardopt_optimizer_reduce_gradient_dlpack(stage2, id, &dl.managed) == SHARDOPT_OK);
        CHECK(dl.deletes == before + 1);
      } else {
        const shardopt_tensor grad = cpu_tensor(g.data(), n, SHARDOPT_DTYPE_F32);
        const shardopt_status status = shardopt_optimizer_reduce_gradient(stage2, id, &grad);
        INFO(last_error());
        REQUIRE(status == SHARDOPT_OK);
        g.assign(g.size(), std::nanf(""));  // read before the call returned: the buffer is free again
      }
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_reduce_gradients(stage2) == SHARDOPT_OK);
    // The norm over the shards' averaged gradients is the same at both stages.
    double norm1 = -1, norm2 = -2;
    REQUIRE(shardopt_optimizer_clip_grad_norm(stage1, 1e9, 2.0, &norm1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_clip_grad_norm(stage2, 1e9, 2.0, &norm2) == SHARDOPT_OK);
    CHECK(norm1 > 0);
    CHECK(norm2 == Approx(norm1).epsilon(1e-6));
    REQUIRE(shardopt_optimizer_step(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(stage2) == SHARDOPT_OK);
  }
  CHECK(dl.deletes == 3);
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
    const std::vector<float> a = param_values<float>(stage1, id), b = param_values<float>(stage2, id);
    CHECK(shardopt_test::bitwise_equal(a, b));
    CHECK(a[0] != model1.values[static_cast<std::size_t>(id)][0]);  // it moved
    int64_t steps = 0;
    REQUIRE(shardopt_optimizer_param_step(stage2, id, &steps) == SHARDOPT_OK);
    CHECK(steps == 3);
  }

  // Stage 2 keeps the gradients of this rank's shard only.
  shardopt_memory_report r1, r2;
  shardopt_memory_report_init(&r1);
  shardopt_memory_report_init(&r2);
  REQUIRE(shardopt_optimizer_memory_report(stage1, &r1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_memory_report(stage2, &r2) == SHARDOPT_OK);
  CHECK(r2.shard_numel == r1.shard_numel);
  // On one node with several ranks (these tests' runs) the rank's node-shared gradient slot
  // (stage 1's gradient buffer, grad_view at stage 2 too) holds them: the shard's average is
  // summed into the slot's own positions, no buffer beside it.
  if (comm.size() == 1) CHECK(r2.grad_bytes == 4 * r2.shard_numel);
  if (comm.size() > 1) CHECK(r2.grad_bytes == r1.grad_bytes);
  CHECK(r1.grad_bytes >= 4 * 171);  // the whole flat gradient buffer
  CHECK(r1.master_bytes == 0);      // f32 params are their own master
  REQUIRE(shardopt_optimizer_destroy(stage1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(stage2) == SHARDOPT_OK);
}

TEST_CASE("reduce_gradient refusals come back as statuses with messages", "[capi][stage2][errors]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {6, 3};
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.stage = 2;
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = create(comm, config, group);
  std::vector<float> g0(6, 1.0f), g1(3, 1.0f);
  const shardopt_tensor grad0 = cpu_tensor(g0.data(), 6, SHARDOPT_DTYPE_F32);
  const shardopt_tensor grad1 = cpu_tensor(g1.data(), 3, SHARDOPT_DTYPE_F32);

  // One rank: no node-shared slot, so no gradient view at stage 2 (several ranks on one node
  // have one: their slot).
  shardopt_tensor view{};
  if (comm.size() == 1) {
    CHECK(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "shardopt_optimizer_grad_view: "));
    CHECK(contains(last_error(), "reduce_gradient()"));
  } else {
    CHECK(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_OK);
    CHECK(view.numel == 6);
  }
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient: grad is NULL");
  CHECK(shardopt_optimizer_reduce_gradient(nullptr, 0, &grad0) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient_dlpack: grad is NULL");
  CHECK(shardopt_optimizer_reduce_gradient(opt, 7, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "parameter id 7 is out of range"));
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad1) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "shardopt_optimizer_reduce_gradient: "));
  CHECK(contains(last_error(), "the gradient of 'p0' has 3 elements"));
  shardopt_tensor bad = grad0;
  bad.dtype = static_cast<shardopt_dtype>(9);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient: grad: dtype 9 is not a shardopt_dtype (0..2)");
  bad = grad0;
  bad.dtype = SHARDOPT_DTYPE_BF16;
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "bf16"));
  // A refused DLPack tensor stays the caller's: its deleter does not run.
  FakeTensor frozen({6});
  frozen.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, &frozen.managed) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "read-only"));
  FakeTensor wrong({5});
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, &wrong.managed) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "has 5 elements"));
  CHECK(frozen.deletes + wrong.deletes == 0);

  // A second hand-over of the same param in one round (on every rank alike); the round still
  // finishes once every param is in.
  REQUIRE(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_OK);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "already handed"));
  REQUIRE(shardopt_optimizer_reduce_gradient(opt, 1, &grad1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // Stage 1, and stage 2 with external storage, have no use for it.
  config.stage = 1;
  opt = create(comm, config, group);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "reduce_gradient() is for stage 2"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("config->stage other than 1 or 2 is refused on every rank, naming the field", "[capi][stage2][errors]") {
  CommHandle comm;
  Model32 model({4});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  shardopt_optimizer_t opt = nullptr;
  for (int32_t stage : {3, 0, -1}) {
    config.stage = stage;
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error() == "shardopt_optimizer_create: config->stage is " + std::to_string(stage) +
                              "; it must be 1 (ZeRO-1) or 2 (ZeRO-2)");
  }
  config.stage = 2;
  config.shard_state = 0;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "it needs config->shard_state = 1"));
  CHECK(opt == nullptr);

  if (comm.size() > 1) {
    // Only rank 1 asks for stage 3: the others learn it from the collective check. (The rank is
    // read first: a successful call clears the last error.)
    const bool culprit = comm.rank() == 1;
    shardopt_optimizer_config_init(&config);
    if (culprit) config.stage = 3;
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    if (culprit) {
      CHECK(contains(last_error(), "config->stage is 3"));
    } else {
      CHECK(contains(last_error(), "failed on rank 1: config->stage is 3"));
    }
    CHECK(opt == nullptr);
  }
}
