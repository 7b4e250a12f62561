// tests/capi/test_capi_appended_fields.cpp — the C++ settings appended to the C structs (pipeline_chunk_bytes, ranks_per_node, the step's phase times) reach the C++ API, and the earlier sizes of those structs are still accepted.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi_test_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Two f32 params of given sizes, bucket view, values the same on every rank.
struct TwoParams {
  std::vector<float> a, b;
  shardopt_param_desc descs[2];
  TwoParams() : a(300), b(77) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 13) / 16.0f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) / 8.0f;
    shardopt_param_desc_init(&descs[0]);
    descs[0].name = "a";
    descs[0].param.data = a.data();
    descs[0].param.numel = static_cast<int64_t>(a.size());
    shardopt_param_desc_init(&descs[1]);
    descs[1].name = "b";
    descs[1].param.data = b.data();
    descs[1].param.numel = static_cast<int64_t>(b.size());
  }
  shardopt_param_group_desc group() const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs;
    g.num_params = 2;
    return g;
  }
};

// Steps twice with gradient 1/4 everywhere; returns every parameter value afterwards.
std::vector<float> train(shardopt_optimizer_t opt) {
  for (int step = 0; step < 2; ++step) {
    for (int32_t id = 0; id < 2; ++id) {
      shardopt_tensor g{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
      for (int64_t i = 0; i < g.numel; ++i) static_cast<float*>(g.data)[i] = 0.25f;
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  std::vector<float> all;
  for (int32_t id = 0; id < 2; ++id) {
    shardopt_tensor v{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
    const float* p = static_cast<const float*>(v.data);
    all.insert(all.end(), p, p + v.numel);
  }
  return all;
}

// The config as the header before pipeline_chunk_bytes declared it.
struct config_before_pipelining {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
};

struct comm_options_before_ranks_per_node {
  size_t struct_size;
  double timeout_seconds;
};

struct step_report_before_times {
  size_t struct_size;
  int32_t skipped;
  double loss_scale;
  double grad_norm;
  double clip_coef;
  int64_t skipped_steps;
};

}  // namespace

TEST_CASE("config.pipeline_chunk_bytes reaches the optimizer and leaves results bitwise the same",
          "[capi][versions]") {
  CommHandle comm;
  TwoParams model;
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  CHECK(config.pipeline_chunk_bytes == 0);
  config.node_shared_params = 0;  // pipelining applies to a buffer of each rank's own
  config.bucket_bytes = 256;
  std::vector<std::vector<float>> results;
  for (const int64_t chunk : {int64_t{0}, int64_t{64}}) {
    config.pipeline_chunk_bytes = chunk;
    shardopt_optimizer_t opt = nullptr;
    REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);
    results.push_back(train(opt));
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  }
  CHECK(results[0] == results[1]);
  CHECK(results[0][0] != model.a[0]);  // it did train

  shardopt_optimizer_t opt = nullptr;
  config.pipeline_chunk_bytes = -1;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "config->pipeline_chunk_bytes must be >= 0 (0: no pipelining), got -1"));
  if (comm.size() > 1) {
    // The C++ agreement compares the field: so it arrived there.
    config.pipeline_chunk_bytes = comm.rank() == 1 ? 128 : 0;
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_MISMATCH);
    CHECK(contains(last_error(), "pipeline_chunk_bytes"));
  }

  // The previous header's config: accepted, its garbage tail ignored, pipelining off.
  auto old = std::make_unique<config_before_pipelining>();
  std::memset(old.get(), 0xcd, sizeof(config_before_pipelining));
  std::memcpy(old.get(), &config, offsetof(shardopt_optimizer_config, node_shared_params) + sizeof(int32_t));
  old->struct_size = sizeof(config_before_pipelining);
  REQUIRE(sizeof(config_before_pipelining) < sizeof(shardopt_optimizer_config));
  {
    const shardopt_status status = shardopt_optimizer_create(
        comm.get(), reinterpret_cast<const shardopt_optimizer_config*>(old.get()), &group, 1, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
  }
  CHECK(train(opt) == results[0]);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("comm options' ranks_per_node decides which ranks share a parameter buffer", "[capi][versions]") {
  shardopt_comm_options options;
  shardopt_comm_options_init(&options);
  CHECK(options.ranks_per_node == 0);
  TwoParams model;
  const shardopt_param_group_desc group = model.group();
  int size = 0;
  for (const int32_t per_node : {0, 1}) {
    CAPTURE(per_node);
    options.ranks_per_node = per_node;
    shardopt_comm_t comm = nullptr;
    REQUIRE(shardopt_comm_world(&options, &comm) == SHARDOPT_OK);
    REQUIRE(shardopt_comm_size(comm, &size) == SHARDOPT_OK);
    shardopt_optimizer_t opt = nullptr;
    REQUIRE(shardopt_optimizer_create(comm, nullptr, &group, 1, &opt) == SHARDOPT_OK);
    shardopt_memory_report report;
    shardopt_memory_report_init(&report);
    REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
    // All ranks of these tests run on one machine: one node of `size` ranks, or nodes of one.
    CHECK(report.node_ranks == (per_node == 1 ? 1 : size));
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_comm_destroy(comm) == SHARDOPT_OK);
  }
  shardopt_comm_t comm = nullptr;
  options.ranks_per_node = -2;
  CHECK(shardopt_comm_world(&options, &comm) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "ranks_per_node"));
  CHECK(comm == nullptr);

  // The previous header's options: accepted, ranks_per_node at its default.
  auto old = std::make_unique<comm_options_before_ranks_per_node>();
  old->struct_size = sizeof(comm_options_before_ranks_per_node);
  old->timeout_seconds = 60.0;
  REQUIRE(shardopt_comm_world(reinterpret_cast<const shardopt_comm_options*>(old.get()), &comm) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_destroy(comm) == SHARDOPT_OK);
  options.struct_size = sizeof(comm_options_before_ranks_per_node) + 4;
  CHECK(shardopt_comm_world(&options, &comm) == SHARDOPT_ERR_STRUCT_SIZE);
}

TEST_CASE("the step report carries the step's phase times; the earlier report is filled without them",
          "[capi][versions]") {
  CommHandle comm;
  TwoParams model;
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  shardopt_step_report report;
  shardopt_step_report_init(&report);
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  CHECK(report.agree_seconds + report.update_seconds + report.sync_seconds == 0.0);  // before any step
  train(opt);
  std::memset(&report, 0xff, sizeof report);  // NaNs: whatever is not written shows
  report.struct_size = sizeof report;
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  CHECK(report.agree_seconds >= 0.0);
  CHECK(report.update_seconds >= 0.0);
  CHECK(report.sync_seconds >= 0.0);
  CHECK(report.agree_seconds + report.update_seconds + report.sync_seconds > 0.0);
  CHECK(report.agree_seconds + report.update_seconds + report.sync_seconds < 60.0);

  auto old = std::make_unique<step_report_before_times>();
  std::memset(old.get(), 0, sizeof(step_report_before_times));
  old->struct_size = sizeof(step_report_before_times);
  REQUIRE(shardopt_optimizer_last_step(opt, reinterpret_cast<shardopt_step_report*>(old.get())) == SHARDOPT_OK);
  CHECK(old->loss_scale == 1.0);
  CHECK(old->grad_norm == -1.0);
  CHECK(old->skipped_steps == 0);
  report.struct_size = sizeof(step_report_before_times) + 8;
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("config.master and config.state_precision reach the optimizer; the struct through `muon_blas_threads` leaves them fp32",
          "[capi][versions][compact]") {
  CommHandle comm;
  std::vector<uint16_t> values(5000, 0x3f80);  // bf16 1.0
  shardopt_param_desc desc;
  shardopt_param_desc_init(&desc);
  desc.name = "w";
  desc.param.data = values.data();
  desc.param.numel = static_cast<int64_t>(values.size());
  desc.param.dtype = SHARDOPT_DTYPE_BF16;
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = &desc;
  group.num_params = 1;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  CHECK(config.state_precision == SHARDOPT_STATE_PRECISION_FP32);
  CHECK(config.master == SHARDOPT_MASTER_FP32);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.partition = SHARDOPT_PARTITION_SORTED_GREEDY;
  config.master = SHARDOPT_MASTER_REMAINDER16;
  config.state_precision = SHARDOPT_STATE_PRECISION_Q8;
  auto report_of = [&](const shardopt_optimizer_config* c) {
    shardopt_optimizer_t opt = nullptr;
    const shardopt_status status = shardopt_optimizer_create(comm.get(), c, &group, 1, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
    shardopt_memory_report r;
    shardopt_memory_report_init(&r);
    REQUIRE(shardopt_optimizer_memory_report(opt, &r) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    return r;
  };
  const shardopt_memory_report compact = report_of(&config);
  // The parameter lives whole on one rank (sorted_greedy): there 2 master bytes per element and
  // 2 bytes of codes plus an absmax per 256-element block and moment.
  if (compact.shard_numel > 0) {
    CHECK(compact.master_bytes == 2 * compact.shard_numel);
    CHECK(compact.state_bytes == 2 * 5000 + 2 * 4 * 20);
  }
  // The header's previous struct (through `muon_blas_threads`): its tail is not read, the state is fp32.
  shardopt_optimizer_config older = config;
  older.struct_size = offsetof(shardopt_optimizer_config, state_precision);
  const shardopt_memory_report plain = report_of(&older);
  if (plain.shard_numel > 0) {
    CHECK(plain.master_bytes == 4 * plain.shard_numel);
    CHECK(plain.state_bytes == 8 * plain.shard_numel);
  }
  shardopt_optimizer_t opt = nullptr;
  config.master = 7;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "config->master is 7, not a shardopt_master_storage"));
  config.master = SHARDOPT_MASTER_REMAINDER16;
  config.partition = SHARDOPT_PARTITION_FLAT;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_UNSUPPORTED);
  CHECK(contains(last_error(), "needs partition = sorted_greedy"));
}
