// tests/capi/test_capi_api_steps.cpp — the C ABI against the C++ API: collective creates failing together, steps bitwise the C++ API's, groups, frozen params, split and borrowed communicators, save/load.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"
#include "capi_api_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;
using namespace shardopt_capi_api_test;

TEST_CASE("a bad argument on one rank fails the collective create on every rank, without a hang", "[capi][collective]") {
  CommHandle comm;
  if (comm.size() < 2) return;  // needs a second rank
  const bool culprit = comm.rank() == 1;
  shardopt_optimizer_t opt = nullptr;

  SECTION("a read-only DLPack tensor on rank 1") {
    FakeTensor w({6});
    if (culprit) w.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    shardopt_param_desc d;
    shardopt_param_desc_init(&d);
    d.name = "w";
    d.param_dlpack = &w.managed;
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = &d;
    g.num_params = 1;
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    if (culprit) {
      CHECK(contains(last_error(), "parameter 'w' (groups[0].params[0]): the tensor is read-only"));
    } else {
      CHECK(contains(last_error(), "ZeroOptimizer failed on rank 1"));
      CHECK(contains(last_error(), "read-only"));
    }
    CHECK(w.deletes == 0);
  }
  SECTION("a wrong struct_size on rank 1 keeps its own status there") {
    RawModel model({4}, false);
    shardopt_optimizer_config config;
    shardopt_optimizer_config_init(&config);
    if (culprit) config.struct_size = 8;
    const shardopt_param_group_desc g = model.group();
    const shardopt_status status = shardopt_optimizer_create(comm.get(), &config, &g, 1, &opt);
    INFO(last_error());
    CHECK(status == (culprit ? SHARDOPT_ERR_STRUCT_SIZE : SHARDOPT_ERR_INVALID_ARGUMENT));
    if (!culprit) CHECK(contains(last_error(), "failed on rank 1: config->struct_size is 8"));
  }
  SECTION("different registrations are a mismatch on every rank") {
    RawModel model({culprit ? 5 : 4}, false);
    const shardopt_param_group_desc g = model.group();
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &opt) == SHARDOPT_ERR_MISMATCH);
    CHECK(contains(last_error(), "ranks disagree on parameter #0"));
  }
  SECTION("add_param_group: a NULL group on rank 1") {
    RawModel model({4}, false);
    const shardopt_param_group_desc g = model.group();
    REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &opt) == SHARDOPT_OK);
    RawModel more({3}, false);
    more.names[0] = "q";
    more.descs[0].name = more.names[0].c_str();
    const shardopt_param_group_desc later = more.group();
    const shardopt_status status = shardopt_optimizer_add_param_group(opt, culprit ? nullptr : &later, nullptr);
    INFO(last_error());
    CHECK(status == (culprit ? SHARDOPT_ERR_NULL_POINTER : SHARDOPT_ERR_INVALID_ARGUMENT));
    if (!culprit) CHECK(contains(last_error(), "add_param_group failed on rank 1: group is NULL"));
    int32_t groups = 0;
    REQUIRE(shardopt_optimizer_num_groups(opt, &groups) == SHARDOPT_OK);
    CHECK(groups == 1);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    opt = nullptr;
  }
  CHECK(opt == nullptr);
}

TEST_CASE("C ABI steps equal C++ API steps bitwise (AdamW, flat, bucket view)", "[capi][step]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 128, 1};
  RawModel model(sizes, false);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;  // several buckets
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);

  shardopt::OptimizerConfig cpp_config;
  cpp_config.algorithm = shardopt::Algorithm::adamw;
  cpp_config.bucket_bytes = 64;
  shardopt::ParamGroupSpec spec;
  spec.hyper.lr = 0.01;
  spec.hyper.weight_decay = 0.1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    spec.params.push_back({model.names[i], {model.values[i].data(), sizes[i]}, {}});
  }
  shardopt::ZeroOptimizer reference(shardopt_test::world(), cpp_config, {spec});

  for (int step = 0; step < 3; ++step) {
    REQUIRE(shardopt_optimizer_zero_grad(opt) == SHARDOPT_OK);
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      const auto g = grad_for(id, step, sizes[static_cast<std::size_t>(id)]);
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      REQUIRE(view.numel == sizes[static_cast<std::size_t>(id)]);
      std::memcpy(view.data, g.data(), g.size() * sizeof(float));
      std::memcpy(reference.grad_view(id).data, g.data(), g.size() * sizeof(float));
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    reference.reduce_gradients();
    reference.step();
  }
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &view) == SHARDOPT_OK);
    CHECK(view.dtype == SHARDOPT_DTYPE_F32);
    CHECK(view.device_kind == SHARDOPT_DEVICE_CPU);
    CHECK(std::memcmp(view.data, reference.param_view(id).data, static_cast<std::size_t>(view.numel) * 4) == 0);
    CHECK(std::memcmp(view.data, model.values[static_cast<std::size_t>(id)].data(), 4) != 0);  // it moved
    int64_t steps = 0;
    REQUIRE(shardopt_optimizer_param_step(opt, id, &steps) == SHARDOPT_OK);
    CHECK(steps == 3);
  }
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  const shardopt::MemoryReport expected = reference.memory_report();
  CHECK(report.state_bytes == expected.state_bytes);
  CHECK(report.shard_numel == expected.shard_numel);
  CHECK(report.trainable_numel == 171);
  CHECK(report.state_bytes == 2 * 4 * report.shard_numel);  // exp_avg + exp_avg_sq of this shard only
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("groups, hyperparameters, frozen params, split and borrowed communicators", "[capi][step]") {
  CommHandle comm;
  RawModel model({8, 4}, true);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.storage = SHARDOPT_STORAGE_EXTERNAL;
  config.partition = SHARDOPT_PARTITION_SORTED_GREEDY;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.5;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = nullptr;
  shardopt_comm_t short_lived = nullptr;
  REQUIRE(shardopt_comm_world(nullptr, &short_lived) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_create(short_lived, &config, &group, 1, &opt) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_destroy(short_lived) == SHARDOPT_OK);  // the optimizer keeps it alive

  int32_t n = 0;
  REQUIRE(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_OK);
  CHECK(n == 2);
  int trainable = 0;
  REQUIRE(shardopt_optimizer_get_trainable(opt, 1, &trainable) == SHARDOPT_OK);
  CHECK(trainable == 1);
  // sorted_greedy: whole params, largest first, to the least loaded rank (torch's rule).
  int32_t owner = -2;
  REQUIRE(shardopt_optimizer_param_owner(opt, 0, &owner) == SHARDOPT_OK);
  CHECK(owner == 0);
  REQUIRE(shardopt_optimizer_param_owner(opt, 1, &owner) == SHARDOPT_OK);
  CHECK(owner == (comm.size() > 1 ? 1 : 0));
  void* stream = &owner;
  REQUIRE(shardopt_optimizer_cuda_stream(opt, &stream) == SHARDOPT_OK);
  CHECK(stream == nullptr);  // CPU parameters
  uint64_t layout_before = 0, layout_after = 0;
  REQUIRE(shardopt_optimizer_layout_version(opt, &layout_before) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_set_trainable(opt, 1, 0) == SHARDOPT_OK);

  // An LR change between steps: SGD without momentum moves each weight by lr * grad.
  REQUIRE(shardopt_optimizer_get_hyperparams(opt, 0, &hyper) == SHARDOPT_OK);
  hyper.lr = 0.25;
  REQUIRE(shardopt_optimizer_set_hyperparams(opt, 0, &hyper) == SHARDOPT_OK);
  const std::vector<float> before0 = model.values[0], before1 = model.values[1];
  for (auto& g : model.grads) std::fill(g.begin(), g.end(), 2.0f);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_layout_version(opt, &layout_after) == SHARDOPT_OK);
  CHECK(layout_after != layout_before);
  for (std::size_t i = 0; i < before0.size(); ++i) CHECK(model.values[0][i] == before0[i] - 0.25f * 2.0f);
  CHECK(model.values[1] == before1);  // frozen
  shardopt_tensor view{};
  REQUIRE(shardopt_optimizer_param_view(opt, 0, &view) == SHARDOPT_OK);
  CHECK(view.data == model.values[0].data());  // external storage: the caller's own buffer
  REQUIRE(shardopt_optimizer_zero_grad(opt) == SHARDOPT_OK);
  CHECK(model.grads[0][0] == 0.0f);
  REQUIRE(shardopt_optimizer_consolidate_state_dict(opt, 0) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // split: every rank alone.
  shardopt_comm_t alone = nullptr;
  REQUIRE(shardopt_comm_split(comm.get(), comm.rank(), 0, &alone) == SHARDOPT_OK);
  int rank = -1, size = -1;
  REQUIRE(shardopt_comm_rank(alone, &rank) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_size(alone, &size) == SHARDOPT_OK);
  CHECK(rank == 0);
  CHECK(size == 1);
  REQUIRE(shardopt_comm_destroy(alone) == SHARDOPT_OK);

  // NCCL: refused cleanly where this build has none (or where there is no device).
  shardopt_comm_t nccl = nullptr;
  const shardopt_status nccl_status = shardopt_comm_nccl(nullptr, nullptr, nullptr, &nccl);
  if (!shardopt::nccl_compiled_in()) {
    CHECK(nccl_status == SHARDOPT_ERR_UNSUPPORTED);
    CHECK(nccl == nullptr);
  }
  if (nccl_status != SHARDOPT_OK) CHECK(contains(last_error(), "shardopt_comm_nccl: "));
  shardopt_comm_destroy(nccl);

  // borrow: the caller's MPI_Comm.
  MPI_Comm mine = MPI_COMM_WORLD;
  shardopt_comm_t borrowed = nullptr;
  REQUIRE(shardopt_comm_borrow(&mine, nullptr, &borrowed) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_size(borrowed, &size) == SHARDOPT_OK);
  CHECK(size == comm.size());
  REQUIRE(shardopt_comm_barrier(borrowed) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_destroy(borrowed) == SHARDOPT_OK);
}

TEST_CASE("save and load through the C ABI restore parameters and steps", "[capi][checkpoint]") {
  CommHandle comm;
  RawModel model({9, 7, 5}, false);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);
  auto one_step = [&](int step) {
    for (int32_t id = 0; id < 3; ++id) {
      shardopt_tensor g{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
      const auto values = grad_for(id, step, g.numel);
      std::memcpy(g.data, values.data(), values.size() * 4);
    }
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  };
  auto params = [&] {
    std::vector<float> all;
    for (int32_t id = 0; id < 3; ++id) {
      shardopt_tensor v{};
      REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
      all.insert(all.end(), static_cast<float*>(v.data), static_cast<float*>(v.data) + v.numel);
    }
    return all;
  };
  one_step(0);
  const std::string dir = std::string(SHARDOPT_CAPI_SCRATCH) + "/np" + std::to_string(comm.size());
  REQUIRE(shardopt_optimizer_save(opt, dir.c_str()) == SHARDOPT_OK);
  const std::vector<float> saved = params();
  one_step(1);
  CHECK(params() != saved);
  REQUIRE(shardopt_optimizer_load(opt, dir.c_str()) == SHARDOPT_OK);
  CHECK(params() == saved);
  int64_t steps = 0;
  REQUIRE(shardopt_optimizer_param_step(opt, 0, &steps) == SHARDOPT_OK);
  CHECK(steps == 1);
  const std::string missing = dir + "/does-not-exist";
  CHECK(shardopt_optimizer_load(opt, missing.c_str()) == SHARDOPT_ERR_IO);
  CHECK(contains(last_error(), "shardopt_optimizer_load: "));

  // A background save of step 1's state, committed by wait_save after a step went on.
  one_step(1);
  const std::vector<float> at_async = params();
  REQUIRE(shardopt_optimizer_save_async(opt, dir.c_str()) == SHARDOPT_OK);
  one_step(2);
  CHECK(params() != at_async);
  REQUIRE(shardopt_optimizer_wait_save(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_wait_save(opt) == SHARDOPT_OK);  // none pending: returns at once
  REQUIRE(shardopt_optimizer_load(opt, dir.c_str()) == SHARDOPT_OK);
  CHECK(params() == at_async);
  REQUIRE(shardopt_optimizer_param_step(opt, 0, &steps) == SHARDOPT_OK);
  CHECK(steps == 2);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
