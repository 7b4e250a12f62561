// tests/capi/test_capi_view_export.cpp — views exported as DLPack tensors keep the memory they point into: after set_trainable / add_param_group and after the optimizer is destroyed they read the old values (node-shared buffers stay mapped); external storage is refused by name.
#include <cstring>
#include <vector>

#include "capi_test_support.hpp"

using namespace shardopt_capi_test;

namespace {

constexpr int64_t kNumel = int64_t{1} << 17;  // own mappings: a freed buffer would be unmapped at once

std::vector<float> pattern(float base) {
  std::vector<float> v(static_cast<std::size_t>(kNumel));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + 0.001f * static_cast<float>(i % 1000);
  return v;
}

shardopt_param_desc param_over(const char* name, std::vector<float>& values) {
  shardopt_param_desc d;
  shardopt_param_desc_init(&d);
  d.name = name;
  d.param = shardopt_tensor{values.data(), static_cast<int64_t>(values.size()), SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  return d;
}

std::vector<float> read(const DLManagedTensorVersioned* t) {
  REQUIRE(t->dl_tensor.ndim == 1);
  const float* p = static_cast<const float*>(t->dl_tensor.data);
  return std::vector<float>(p, p + t->dl_tensor.shape[0]);
}

}  // namespace

TEST_CASE("an exported view survives a re-layout and the optimizer's destruction", "[capi][dlpack]") {
  CommHandle comm;
  for (int node_shared : {0, 1}) {
    for (int relayout : {0, 1}) {  // set_trainable, add_param_group
      CAPTURE(node_shared, relayout);
      std::vector<float> w = pattern(1.f), b = pattern(2.f), c = pattern(3.f), g = pattern(-4.f);
      const shardopt_param_desc params[] = {param_over("w", w), param_over("b", b)};
      shardopt_param_group_desc group;
      shardopt_param_group_desc_init(&group);
      group.params = params;
      group.num_params = 2;
      shardopt_optimizer_config config;
      shardopt_optimizer_config_init(&config);
      config.node_shared_params = node_shared;
      shardopt_optimizer_t opt = nullptr;
      REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);

      DLManagedTensorVersioned* kept_param = nullptr;
      DLManagedTensorVersioned* kept_grad = nullptr;
      REQUIRE(shardopt_optimizer_param_view_dlpack(opt, 0, &kept_param) == SHARDOPT_OK);
      REQUIRE(shardopt_optimizer_grad_view_dlpack(opt, 1, &kept_grad) == SHARDOPT_OK);
      CHECK(kept_param->version.major == DLPACK_MAJOR_VERSION);
      CHECK(kept_param->dl_tensor.dtype.code == kDLFloat);
      CHECK(kept_param->dl_tensor.dtype.bits == 32);
      CHECK(kept_param->dl_tensor.device.device_type == kDLCPU);
      CHECK(kept_param->dl_tensor.shape[0] == kNumel);
      std::memcpy(kept_grad->dl_tensor.data, g.data(), g.size() * sizeof(float));

      if (relayout == 0) {
        REQUIRE(shardopt_optimizer_set_trainable(opt, 0, 0) == SHARDOPT_OK);
      } else {
        const shardopt_param_desc more[] = {param_over("c", c)};
        shardopt_param_group_desc later;
        shardopt_param_group_desc_init(&later);
        later.params = more;
        later.num_params = 1;
        int32_t index = -1;
        REQUIRE(shardopt_optimizer_add_param_group(opt, &later, &index) == SHARDOPT_OK);
      }
      // The kept tensors read the old buffers, with the values of the moment of the change.
      CHECK(read(kept_param) == w);
      CHECK(read(kept_grad) == g);
      // A new view: the new layout, elsewhere, with the values carried over.
      shardopt_tensor now{};
      REQUIRE(shardopt_optimizer_param_view(opt, 0, &now) == SHARDOPT_OK);
      CHECK(now.data != kept_param->dl_tensor.data);
      CHECK(std::memcmp(now.data, w.data(), w.size() * sizeof(float)) == 0);

      REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
      CHECK(read(kept_param) == w);  // and past the optimizer
      kept_param->deleter(kept_param);
      CHECK(read(kept_grad) == g);
      kept_grad->deleter(kept_grad);
    }
  }
}

TEST_CASE("exporting a view of external storage is refused by name", "[capi][dlpack]") {
  CommHandle comm;
  std::vector<float> w(8, 1.f), gw(8, 0.f);
  shardopt_param_desc p;
  shardopt_param_desc_init(&p);
  p.name = "w";
  p.param = shardopt_tensor{w.data(), 8, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  p.grad = shardopt_tensor{gw.data(), 8, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = &p;
  group.num_params = 1;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.storage = SHARDOPT_STORAGE_EXTERNAL;
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);
  DLManagedTensorVersioned* out = nullptr;
  CHECK(shardopt_optimizer_param_view_dlpack(opt, 0, &out) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK_THAT(last_error(), Catch::Contains("bucket_view storage only"));
  CHECK(out == nullptr);
  CHECK(shardopt_optimizer_param_view_dlpack(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
