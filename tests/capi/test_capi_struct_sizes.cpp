// tests/capi/test_capi_struct_sizes.cpp — struct sizes of earlier shardopt.h versions still accepted through the C ABI, others refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstddef>
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

// ---- struct sizes of earlier headers ------------------------------------------------------------------

namespace {

// The two structs as the earlier header declared them, before fields were appended.
struct config_before_stage {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
};

// The second version, before `defaults` was appended.
struct config_before_defaults {
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
};

// The header before node_shared_params: through `defaults`.
struct config_before_node_sharing {
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
};

// The header before pipeline_chunk_bytes: through node_shared_params.
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

struct config_before_join {
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
  int64_t pipeline_chunk_bytes;
};

struct config_before_overlap {
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
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
};

struct config_before_muon {
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
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
  int64_t overlap;
};

struct memory_report_before_master {
  size_t struct_size;
  int64_t state_bytes;
  int64_t param_buffer_bytes;
  int64_t grad_buffer_bytes;
  int64_t shard_numel;
  int64_t trainable_numel;
};

}  // namespace

TEST_CASE("struct sizes of the earlier header are still accepted; others are refused", "[capi][errors][versions]") {
  CommHandle comm;
  Model32 model({9, 7});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;

  // An earlier program's config: exactly its size on the heap (reading past it is an ASan
  // error), its tail padding (where `stage` now lies) garbage.
  auto old = std::make_unique<config_before_stage>();
  std::memset(old.get(), 0xab, sizeof(config_before_stage));
  old->struct_size = sizeof(config_before_stage);
  old->algorithm = SHARDOPT_ALGORITHM_SGD;
  old->partition = SHARDOPT_PARTITION_FLAT;
  old->storage = SHARDOPT_STORAGE_BUCKET_VIEW;
  old->shard_state = 1;
  old->bucket_bytes = 64;
  old->threads = 0;
  REQUIRE(sizeof(config_before_stage) < sizeof(shardopt_optimizer_config));
  {
    const shardopt_status status = shardopt_optimizer_create(
        comm.get(), reinterpret_cast<const shardopt_optimizer_config*>(old.get()), &group, 1, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
  }
  // The appended fields took their defaults: stage 1 (grad views work), no loss scaling.
  shardopt_tensor view{};
  REQUIRE(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_OK);
  CHECK(loss_scale(opt) == 1.0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);

  // An earlier program's memory report: the first five fields only, nothing written past them.
  auto old_report = std::make_unique<memory_report_before_master>();
  std::memset(old_report.get(), 0, sizeof(memory_report_before_master));
  old_report->struct_size = sizeof(memory_report_before_master);
  REQUIRE(shardopt_optimizer_memory_report(opt, reinterpret_cast<shardopt_memory_report*>(old_report.get())) ==
          SHARDOPT_OK);
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  CHECK(old_report->struct_size == sizeof(memory_report_before_master));
  CHECK(old_report->state_bytes == report.state_bytes);
  CHECK(old_report->param_buffer_bytes == report.param_buffer_bytes);
  CHECK(old_report->grad_buffer_bytes == report.grad_buffer_bytes);
  CHECK(old_report->shard_numel == report.shard_numel);
  CHECK(old_report->trainable_numel == 16);
  CHECK(report.param_bytes + report.node_shared_param_bytes > 0);  // node-shared by default
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // Sizes of no version: below the oldest, between versions, above the newest.
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  const std::string accepts = "which also accepts " + std::to_string(sizeof(config_before_stage)) + ", " +
                              std::to_string(sizeof(config_before_defaults)) + ", " +
                              std::to_string(sizeof(config_before_node_sharing)) + ", " +
                              std::to_string(sizeof(config_before_pipelining)) + ", " +
                              std::to_string(sizeof(config_before_join)) + ", " +
                              std::to_string(sizeof(config_before_overlap)) + ", " +
                              std::to_string(sizeof(config_before_muon)) + ", " +
                              // the struct through `muon_blas_threads`, before state_precision and master
                              std::to_string(offsetof(shardopt_optimizer_config, state_precision)) +
                              " from earlier headers";
  config.struct_size = sizeof(config_before_stage) - 8;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "too small"));
  CHECK(contains(last_error(), accepts));
  const std::size_t between = sizeof(config_before_stage) + 8;  // between the first two versions
  REQUIRE(between < sizeof(config_before_defaults));
  config.struct_size = between;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(last_error() == "shardopt_optimizer_create: config->struct_size is " + std::to_string(between) +
                            ", but shardopt_optimizer_config is " + std::to_string(sizeof(config)) +
                            " bytes in this library, " + accepts +
                            " (not the size of any version it knows); set it to sizeof(shardopt_optimizer_config), "
                            "e.g. with shardopt_optimizer_config_init()");
  config.struct_size = sizeof(config) + 8;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  CHECK(opt == nullptr);

  config.struct_size = sizeof(config);
  opt = create(comm, config, group);
  report.struct_size = sizeof(memory_report_before_master) + 8;
  CHECK(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is " + std::to_string(sizeof(memory_report_before_master) + 8)));
  CHECK(contains(last_error(), "shardopt_memory_report_init()"));
  report.struct_size = sizeof(report) + 8;
  CHECK(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
