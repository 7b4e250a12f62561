// tests/capi/test_capi_overlap.cpp — config.overlap through the C ABI: grad_ready, reduce_gradient at stage 1, wait_param/wait_bucket/wait_all, the earlier config size, and a refused value.
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

struct Params {
  std::vector<float> a, b, c;
  shardopt_param_desc descs[3];
  Params() : a(300), b(77), c(41) {
    std::vector<float>* all[3] = {&a, &b, &c};
    const char* names[3] = {"a", "b", "c"};
    for (int k = 0; k < 3; ++k) {
      for (std::size_t i = 0; i < all[k]->size(); ++i) (*all[k])[i] = static_cast<float>((i * 7 + k) % 13) / 16.0f;
      shardopt_param_desc_init(&descs[k]);
      descs[k].name = names[k];
      descs[k].param.data = all[k]->data();
      descs[k].param.numel = static_cast<int64_t>(all[k]->size());
    }
  }
  shardopt_param_group_desc group() const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs;
    g.num_params = 3;
    return g;
  }
};

// Rank-dependent gradients, handed last param first: stage 2 with reduce_gradient; stage 1
// plain in place, overlapped with reduce_gradient for param 1 and grad_ready for the others.
// Every param is waited for before it is read.
std::vector<float> train(shardopt_optimizer_t opt, int rank, int stage, bool overlapped) {
  for (int step = 0; step < 3; ++step) {
    for (int32_t id = 2; id >= 0; --id) {
      shardopt_tensor v{};
      REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
      std::vector<float> values(static_cast<std::size_t>(v.numel));
      for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<float>((i + 3 * rank + 5 * step + id) % 11) / 8.0f - 0.6f;
      }
      if (stage == 2 || (overlapped && id == 1)) {
        shardopt_tensor t = v;
        t.data = values.data();
        REQUIRE(shardopt_optimizer_reduce_gradient(opt, id, &t) == SHARDOPT_OK);
        continue;
      }
      shardopt_tensor g{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
      std::memcpy(g.data, values.data(), values.size() * sizeof(float));
      if (overlapped) REQUIRE(shardopt_optimizer_grad_ready(opt, id) == SHARDOPT_OK);
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  std::vector<float> all;
  for (int32_t id = 0; id < 3; ++id) {
    REQUIRE(shardopt_optimizer_wait_param(opt, id) == SHARDOPT_OK);
    shardopt_tensor v{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
    const float* p = static_cast<const float*>(v.data);
    all.insert(all.end(), p, p + v.numel);
  }
  REQUIRE(shardopt_optimizer_wait_all(opt) == SHARDOPT_OK);
  return all;
}

// The config as the header before `overlap` declared it.
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

}  // namespace

TEST_CASE("config.overlap through the C ABI equals the plain step bitwise", "[capi][overlap]") {
  CommHandle comm;
  Params model;
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  CHECK(config.overlap == SHARDOPT_OVERLAP_OFF);
  config.node_shared_params = 0;
  config.bucket_bytes = 256;
  for (int stage : {1, 2}) {
    config.stage = stage;
    std::vector<std::vector<float>> results;
    for (int64_t overlap : {int64_t{SHARDOPT_OVERLAP_OFF}, int64_t{SHARDOPT_OVERLAP_AFTER_BACKWARD},
                            int64_t{SHARDOPT_OVERLAP_PER_BUCKET}}) {
      INFO("stage " << stage << ", overlap " << overlap);
      config.overlap = overlap;
      shardopt_optimizer_t opt = nullptr;
      REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);
      int32_t buckets = 0;
      REQUIRE(shardopt_optimizer_num_buckets(opt, &buckets) == SHARDOPT_OK);
      CHECK(buckets > 1);
      CHECK(shardopt_optimizer_wait_bucket(opt, buckets) == SHARDOPT_ERR_INVALID_ARGUMENT);
      CHECK(contains(last_error(), "is out of range"));
      results.push_back(train(opt, comm.rank(), stage, overlap != SHARDOPT_OVERLAP_OFF));
      REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    }
    CHECK(results[0] != std::vector<float>(results[0].size(), 0.f));
    CHECK(results[0][0] != model.a[0]);
    CHECK(results[1] == results[0]);
    CHECK(results[2] == results[0]);
  }

  config.stage = 1;
  config.overlap = 3;
  shardopt_optimizer_t opt = nullptr;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "config->overlap is 3, not a shardopt_overlap_policy (0..2)"));

  // The previous header's config: accepted, its garbage tail ignored, overlap off.
  auto old = std::make_unique<config_before_overlap>();
  std::memset(old.get(), 0xcd, sizeof(config_before_overlap));
  std::memcpy(old.get(), &config, offsetof(shardopt_optimizer_config, divide_by_initial_world_size) + sizeof(int32_t));
  old->struct_size = sizeof(config_before_overlap);
  REQUIRE(sizeof(config_before_overlap) < sizeof(shardopt_optimizer_config));
  REQUIRE(shardopt_optimizer_create(comm.get(), reinterpret_cast<const shardopt_optimizer_config*>(old.get()), &group,
                                    1, &opt) == SHARDOPT_OK);
  // Without overlap grad_ready only checks its argument, and the waits return at once.
  CHECK(shardopt_optimizer_grad_ready(opt, 0) == SHARDOPT_OK);
  CHECK(shardopt_optimizer_wait_param(opt, 0) == SHARDOPT_OK);
  CHECK(shardopt_optimizer_grad_ready(opt, 3) == SHARDOPT_ERR_INVALID_ARGUMENT);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
