// tests/capi/test_capi_training_join.cpp — the C ABI's node_shared_params (one buffer per node) and Join with uneven steps.
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

TEST_CASE("node_shared_params: one parameter buffer per node, or one per rank when off", "[capi][node_sharing]") {
  CommHandle comm;
  Model32 model({300, 17});
  const shardopt_param_group_desc group = model.group();
  for (int32_t shared : {1, 0}) {
    CAPTURE(shared);
    shardopt_optimizer_config config;
    shardopt_optimizer_config_init(&config);
    CHECK(config.node_shared_params == 1);  // the default
    config.node_shared_params = shared;
    shardopt_optimizer_t opt = create(comm, config, group);
    shardopt_memory_report report;
    shardopt_memory_report_init(&report);
    REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
    const bool sharing = shared != 0 && comm.size() > 1;  // all ranks of these tests share a node
    CHECK((report.param_bytes > 0) == !sharing);
    CHECK((report.node_shared_param_bytes > 0) == sharing);
    CHECK(report.param_bytes + report.node_shared_param_bytes >= 4 * 317);
    CHECK(report.node_ranks == (sharing ? comm.size() : 1));
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  }
}

// ---- Join -----------------------------------------------------------------------------------------

namespace {

// Rank r takes 1 + r steps through the C ABI, then joins; returns its parameters.
std::vector<std::vector<float>> uneven_c_run(const CommHandle& comm, int32_t divide_by_world) {
  const std::vector<int64_t> sizes = {37, 5, 128};
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;
  config.divide_by_initial_world_size = divide_by_world;
  shardopt_optimizer_t opt = create(comm, config, model.group());
  for (int step = 0; step < 1 + comm.rank(); ++step) {
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      float* g = static_cast<float*>(view.data);
      for (int64_t i = 0; i < view.numel; ++i) g[i] = exact_grad(id, step, i, comm.rank());
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  const shardopt_status joined = shardopt_optimizer_join(opt);
  INFO(last_error());
  REQUIRE(joined == SHARDOPT_OK);
  std::vector<std::vector<float>> params;
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) params.push_back(param_values<float>(opt, id));
  shardopt_optimizer_destroy(opt);
  return params;
}

}  // namespace

TEST_CASE("join through the C ABI: uneven steps leave every rank with the same parameters", "[capi][join]") {
  CommHandle comm;
  const std::vector<std::vector<float>> by_active = uneven_c_run(comm, 0);
  // Rank 0's values reach every rank bit for bit: each rank compares its own with them.
  for (const std::vector<float>& p : by_active) {
    std::vector<float> root = p;
    shardopt_test::world()->broadcast(root.data(), static_cast<int64_t>(root.size()), shardopt::DType::f32, 0);
    CHECK(shardopt_test::bitwise_equal(root, p));
  }
  if (comm.size() > 1) {
    // The divisor option travels in the appended config field.
    const std::vector<std::vector<float>> by_world = uneven_c_run(comm, 1);
    CHECK_FALSE(shardopt_test::bitwise_equal(by_world[0], by_active[0]));
  }
}
