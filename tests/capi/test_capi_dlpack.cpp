// tests/capi/test_capi_dlpack.cpp — DLPack import through the C ABI: hand-built tensors accepted and refused (status and message), and who calls the deleter when.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi_test_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;

TEST_CASE("compact float tensors on the CPU and CUDA are accepted and described", "[capi][dlpack]") {
  SECTION("f32 2x3, strides NULL") {
    FakeTensor t({2, 3});
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
    CHECK(out.data == t.storage.data());
    CHECK(out.numel == 6);
    CHECK(out.dtype == SHARDOPT_DTYPE_F32);
    CHECK(out.device_kind == SHARDOPT_DEVICE_CPU);
    CHECK(out.device_index == 0);
    CHECK(std::string(shardopt_last_error()).empty());
  }
  SECTION("explicit compact strides, and any stride on an extent of 1") {
    FakeTensor t({2, 1, 3});
    t.set_strides({3, 99, 1});
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
    CHECK(out.numel == 6);
  }
  SECTION("bfloat16 and float16") {
    FakeTensor bf({4});
    bf.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 16, 1};
    FakeTensor f16({4});
    f16.managed.dl_tensor.dtype = DLDataType{kDLFloat, 16, 1};
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&bf.managed, &out) == SHARDOPT_OK);
    CHECK(out.dtype == SHARDOPT_DTYPE_BF16);
    REQUIRE(shardopt_tensor_from_dlpack(&f16.managed, &out) == SHARDOPT_OK);
    CHECK(out.dtype == SHARDOPT_DTYPE_F16);
  }
  SECTION("a CUDA tensor keeps its device ordinal (its memory is never touched)") {
    FakeTensor t({8});
    t.managed.dl_tensor.device = DLDevice{kDLCUDA, 1};
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
    CHECK(out.device_kind == SHARDOPT_DEVICE_CUDA);
    CHECK(out.device_index == 1);
  }
  SECTION("a 0-d tensor has one element; byte_offset moves the data pointer") {
    FakeTensor t({});
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
    CHECK(out.numel == 1);
    FakeTensor o({4});
    o.managed.dl_tensor.byte_offset = 8;
    REQUIRE(shardopt_tensor_from_dlpack(&o.managed, &out) == SHARDOPT_OK);
    CHECK(out.data == o.storage.data() + 2);
  }
  SECTION("an empty tensor may have a NULL data pointer and any strides") {
    FakeTensor t({0, 5});
    t.managed.dl_tensor.data = nullptr;
    t.set_strides({7, 3});
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
    CHECK(out.numel == 0);
  }
  SECTION("a newer minor version and the IS_COPIED flag are fine") {
    FakeTensor t({3});
    t.managed.version.minor = 99;
    t.managed.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
    shardopt_tensor out{};
    REQUIRE(shardopt_tensor_from_dlpack(&t.managed, &out) == SHARDOPT_OK);
  }
}

namespace {

// Expects `t` to be refused with `status` and a message containing each of `parts`.
void check_refused(FakeTensor& t, shardopt_status status, const std::vector<std::string>& parts) {
  shardopt_tensor out{};
  CHECK(shardopt_tensor_from_dlpack(&t.managed, &out) == status);
  const std::string message = last_error();
  INFO(message);
  CHECK(message.rfind("shardopt_tensor_from_dlpack: tensor: ", 0) == 0);
  for (const std::string& part : parts) CHECK(message.find(part) != std::string::npos);
  CHECK(t.deletes == 0);  // validation never takes ownership
}

}  // namespace

TEST_CASE("each unacceptable DLPack tensor is refused with its status and a message that says why", "[capi][dlpack]") {
  SECTION("major version other than 1: nothing else is read") {
    FakeTensor t({3});
    t.managed.version.major = 0;
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"DLPack major version 0", "1.x"});
    t.managed.version.major = 2;
    t.managed.dl_tensor.ndim = -5;  // garbage in a different layout must not be looked at
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"DLPack major version 2"});
  }
  SECTION("dtypes other than float32/bfloat16/float16") {
    FakeTensor t({3});
    t.managed.dl_tensor.dtype = DLDataType{kDLFloat, 64, 1};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"dtype float64", "float32, bfloat16 or float16"});
    t.managed.dl_tensor.dtype = DLDataType{kDLInt, 32, 1};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"dtype int32"});
    t.managed.dl_tensor.dtype = DLDataType{kDLFloat, 32, 4};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"float32 x4 lanes"});
    t.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 32, 1};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"bfloat32"});
  }
  SECTION("devices other than kDLCPU and kDLCUDA") {
    FakeTensor t({3});
    t.managed.dl_tensor.device = DLDevice{kDLCUDAHost, 0};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"kDLCUDAHost (3) is not supported", "kDLCPU or kDLCUDA"});
    t.managed.dl_tensor.device = DLDevice{kDLROCM, 0};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"kDLROCM"});
    t.managed.dl_tensor.device = DLDevice{static_cast<DLDeviceType>(99), 0};
    check_refused(t, SHARDOPT_ERR_UNSUPPORTED, {"device type (99) is not supported"});
    t.managed.dl_tensor.device = DLDevice{kDLCUDA, -1};
    check_refused(t, SHARDOPT_ERR_INVALID_ARGUMENT, {"CUDA device id is negative"});
  }
  SECTION("read-only") {
    FakeTensor t({3});
    t.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    check_refused(t, SHARDOPT_ERR_INVALID_ARGUMENT, {"read-only", "DLPACK_FLAG_BITMASK_READ_ONLY"});
  }
  SECTION("not contiguous: transposed, or every other element") {
    FakeTensor t({2, 3});
    t.set_strides({1, 2});
    check_refused(t, SHARDOPT_ERR_INVALID_ARGUMENT, {"not contiguous", "stride 2 of dimension 1 (extent 3) should be 1"});
    FakeTensor s({2, 3}, 12);
    s.set_strides({6, 2});
    check_refused(s, SHARDOPT_ERR_INVALID_ARGUMENT, {"not contiguous"});
  }
  SECTION("malformed shapes and pointers") {
    FakeTensor t({2, 3});
    t.managed.dl_tensor.ndim = -1;
    check_refused(t, SHARDOPT_ERR_INVALID_ARGUMENT, {"ndim is negative"});
    t.managed.dl_tensor.ndim = 2;
    t.managed.dl_tensor.shape = nullptr;
    check_refused(t, SHARDOPT_ERR_INVALID_ARGUMENT, {"shape is NULL but ndim is 2"});
    FakeTensor n({2, -3});
    check_refused(n, SHARDOPT_ERR_INVALID_ARGUMENT, {"shape[1] is negative"});
    FakeTensor huge({int64_t{1} << 40, int64_t{1} << 40});
    check_refused(huge, SHARDOPT_ERR_INVALID_ARGUMENT, {"overflows"});
    FakeTensor d({4});
    d.managed.dl_tensor.data = nullptr;
    check_refused(d, SHARDOPT_ERR_INVALID_ARGUMENT, {"data is NULL but it has 4 elements"});
    FakeTensor a({4});
    a.managed.dl_tensor.byte_offset = 2;
    check_refused(a, SHARDOPT_ERR_INVALID_ARGUMENT, {"not aligned to its 4-byte elements"});
  }
  SECTION("NULL arguments") {
    FakeTensor t({3});
    shardopt_tensor out{};
    CHECK(shardopt_tensor_from_dlpack(nullptr, &out) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_tensor_from_dlpack: tensor is NULL");
    CHECK(shardopt_tensor_from_dlpack(&t.managed, nullptr) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_tensor_from_dlpack: out is NULL");
  }
}

namespace {

shardopt_param_desc dlpack_param(const char* name, FakeTensor* param, FakeTensor* grad = nullptr) {
  shardopt_param_desc d;
  shardopt_param_desc_init(&d);
  d.name = name;
  d.param_dlpack = param != nullptr ? &param->managed : nullptr;
  d.grad_dlpack = grad != nullptr ? &grad->managed : nullptr;
  return d;
}

shardopt_param_group_desc group_of(const shardopt_param_desc* params, size_t n,
                                   const shardopt_hyperparams* hyper = nullptr) {
  shardopt_param_group_desc g;
  shardopt_param_group_desc_init(&g);
  g.params = params;
  g.num_params = n;
  g.hyperparams = hyper;
  return g;
}

}  // namespace

TEST_CASE("an accepted DLPack tensor is deleted exactly once, when the optimizer is destroyed", "[capi][dlpack]") {
  CommHandle comm;
  SECTION("bucket view: the tensor gives the initial values") {
    FakeTensor w({3, 5});
    for (std::size_t i = 0; i < w.storage.size(); ++i) w.storage[i] = 0.25f * static_cast<float>(i);
    FakeTensor b({5});
    const shardopt_param_desc params[] = {dlpack_param("w", &w), dlpack_param("b", &b)};
    const shardopt_param_group_desc group = group_of(params, 2);
    shardopt_optimizer_t opt = nullptr;
    REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_param_view(opt, 0, &view) == SHARDOPT_OK);
    REQUIRE(view.numel == 15);
    CHECK(std::memcmp(view.data, w.storage.data(), 15 * sizeof(float)) == 0);
    CHECK(view.data != w.storage.data());  // shardopt's own flat buffer
    CHECK(w.deletes == 0);
    CHECK(b.deletes == 0);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    CHECK(w.deletes == 1);
    CHECK(b.deletes == 1);
  }
  SECTION("external storage: the step writes into the tensors; a later param group's tensors too") {
    FakeTensor w({6}), gw({6}), extra({4}), gextra({4});
    for (float& v : w.storage) v = 1.0f;
    for (float& v : gw.storage) v = 0.5f;
    shardopt_optimizer_config config;
    shardopt_optimizer_config_init(&config);
    config.algorithm = SHARDOPT_ALGORITHM_SGD;
    config.storage = SHARDOPT_STORAGE_EXTERNAL;
    shardopt_hyperparams hyper;
    shardopt_hyperparams_init(&hyper);
    hyper.lr = 0.1;
    const shardopt_param_desc params[] = {dlpack_param("w", &w, &gw)};
    const shardopt_param_group_desc group = group_of(params, 1, &hyper);
    shardopt_optimizer_t opt = nullptr;
    REQUIRE(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_OK);
    const shardopt_param_desc more[] = {dlpack_param("extra", &extra, &gextra)};
    const shardopt_param_group_desc later = group_of(more, 1, &hyper);
    int32_t index = -1;
    REQUIRE(shardopt_optimizer_add_param_group(opt, &later, &index) == SHARDOPT_OK);
    CHECK(index == 1);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    for (float v : w.storage) CHECK(v == 1.0f - 0.1f * 0.5f);
    CHECK(w.deletes + gw.deletes + extra.deletes + gextra.deletes == 0);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    CHECK(w.deletes == 1);
    CHECK(gw.deletes == 1);
    CHECK(extra.deletes == 1);
    CHECK(gextra.deletes == 1);
  }
  SECTION("a producer without a deleter is fine") {
    FakeTensor w({4});
    w.managed.deleter = nullptr;
    const shardopt_param_desc params[] = {dlpack_param("w", &w)};
    const shardopt_param_group_desc group = group_of(params, 1);
    shardopt_optimizer_t opt = nullptr;
    REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  }
}

TEST_CASE("a refused create leaves every DLPack tensor with the caller, undeleted", "[capi][dlpack]") {
  CommHandle comm;
  FakeTensor ok({4}), bad({4});
  bad.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  const shardopt_param_desc params[] = {dlpack_param("fine", &ok), dlpack_param("frozen_weights", &bad)};
  const shardopt_param_group_desc group = group_of(params, 2);
  shardopt_optimizer_t opt = reinterpret_cast<shardopt_optimizer_t>(&ok);  // must be reset to NULL
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(opt == nullptr);
  const std::string message = last_error();
  INFO(message);
  CHECK(message.find("parameter 'frozen_weights' (groups[0].params[1]): the tensor is read-only") != std::string::npos);
  CHECK(ok.deletes == 0);
  CHECK(bad.deletes == 0);

  SECTION("describing a buffer both raw and as DLPack is refused") {
    shardopt_param_desc both = dlpack_param("both", &ok);
    both.param.data = ok.storage.data();
    both.param.numel = 4;
    const shardopt_param_group_desc g = group_of(&both, 1);
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("both param and param_dlpack are given") != std::string::npos);
    CHECK(ok.deletes == 0);
  }
  SECTION("a gradient in bucket view storage is refused by the optimizer") {
    FakeTensor grad({4});
    const shardopt_param_desc with_grad = dlpack_param("w", &ok, &grad);
    const shardopt_param_group_desc g = group_of(&with_grad, 1);
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error().find("bucket_view storage shardopt owns the gradient") != std::string::npos);
    CHECK(ok.deletes == 0);
    CHECK(grad.deletes == 0);
  }
}
