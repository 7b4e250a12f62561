// tests/gpu/test_cuda_api_errors.cpp — argument checks of the CUDA kernel API and its errors on a machine without a device (no GPU needed).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda/update_cuda.hpp"
#include "gpu_test_support.hpp"
#include "shardopt/error.hpp"

namespace {

using namespace shardopt::kernels;
using shardopt::DType;
using shardopt::Error;
using shardopt::ErrorCode;

// Runs `call` and returns the Error it must throw.
template <typename Call>
Error error_of(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected shardopt::Error");
  return Error(ErrorCode::internal, "unreachable");
}

UpdateTensors f32_tensors(float* param, const float* grad) { return UpdateTensors{param, grad, nullptr, DType::f32}; }

}  // namespace

TEST_CASE("bad arguments raise invalid_argument before touching CUDA", "[cuda][api]") {
  // Never dereferenced: every call below must be rejected before any launch.
  std::vector<float> host(16, 0.f);
  float* p = host.data();
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1);
  AdamScalars amsgrad = adam;
  amsgrad.amsgrad = true;
  const SgdScalars momentum = make_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, false, true);

  Error e = error_of([&] { adam_update_cuda(f32_tensors(p, p), p, p, nullptr, -1, adam, {}, {}, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("negative element count -1"));

  e = error_of([&] { adam_update_cuda(f32_tensors(p, p), p, p, nullptr, 8, amsgrad, {}, {}, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("max_exp_avg_sq"));

  e = error_of([&] { adam_update_cuda(f32_tensors(p, nullptr), p, p, nullptr, 8, adam, {}, {}, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`grad` is null"));

  e = error_of([&] { sgd_update_cuda(f32_tensors(p, p), nullptr, 8, momentum, {}, {}, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("momentum_buf"));

  e = error_of([&] { grad_stats_cuda(p, DType::f32, 8, 1.f, false, nullptr, false, nullptr, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`out` is null"));
  e = error_of([&] { divide_cuda(p, DType::f32, -2, 2.f, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("negative element count -2"));

  // Empty ranges are no-ops that need no device at all (null pointers allowed).
  REQUIRE_NOTHROW(adam_update_cuda(f32_tensors(nullptr, nullptr), nullptr, nullptr, nullptr, 0, amsgrad, {}, {}, nullptr));
  REQUIRE_NOTHROW(sgd_update_cuda(f32_tensors(nullptr, nullptr), nullptr, 0, momentum, {}, {}, nullptr));
  REQUIRE_NOTHROW(divide_cuda(nullptr, DType::f32, 0, 2.f, nullptr));
}

TEST_CASE("without a device, launches raise Error(cuda) with CUDA's reason", "[cuda][api]") {
  std::string reason;
  if (shardopt_test::cuda_device_present(&reason)) {
    // Host pointers would fault on a real device; this case is about machines without one.
    SUCCEED("a CUDA device is present; the device-less error path is not exercised here");
    return;
  }
  REQUIRE_FALSE(reason.empty());
  std::vector<float> host(16, 0.f);
  float* p = host.data();
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1);
  LaunchCache launch;
  const Error e =
      error_of([&] { adam_update_cuda(f32_tensors(p, p), p, p, nullptr, 16, adam, {}, {}, nullptr, &launch); });
  REQUIRE(e.code() == ErrorCode::cuda);
  REQUIRE_THAT(e.what(), Catch::Contains("adam_update_cuda"));
  REQUIRE_THAT(e.what(), Catch::Contains(reason));
  // A failed query leaves nothing behind: the next launch asks again.
  REQUIRE(launch.queries() == 0);
  REQUIRE(launch.sms() == 0);
  REQUIRE(launch.blocks_per_sm(LaunchCache::slot(LaunchKernel::adam, 0, false, false)) == 0);
}
