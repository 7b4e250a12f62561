// tests/gpu/test_cuda_mixed_api_errors.cpp — argument checks of the mixed-precision CUDA API, which reject bad calls before touching CUDA (no GPU needed).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "cuda/update_cuda.hpp"
#include "shardopt/error.hpp"

namespace {

using namespace shardopt::kernels;
using shardopt::DType;
using shardopt::Error;
using shardopt::ErrorCode;

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

}  // namespace

TEST_CASE("mixed updates check the master against the dtype and every buffer they use", "[cuda][api][mixed]") {
  // Never dereferenced: every call below must be rejected before any launch.
  std::vector<float> host(16, 0.f);
  float* p = host.data();
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, true, false, 1);
  const SgdScalars momentum = make_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, false, true);
  const GradTransform gt;
  const Rounding r;

  Error e = error_of([&] { adam_update_cuda(UpdateTensors{p, p, p, DType::f32}, p, p, p, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("its own master"));

  e = error_of([&] { adam_update_cuda(UpdateTensors{p, p, nullptr, DType::bf16}, p, p, p, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("needs an fp32 master"));

  e = error_of([&] { adam_update_cuda(UpdateTensors{p, p, p, DType::f16}, p, p, nullptr, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("max_exp_avg_sq"));

  e = error_of([&] { sgd_update_cuda(UpdateTensors{p, nullptr, p, DType::bf16}, p, 8, momentum, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`grad` is null"));

  e = error_of([&] { sgd_update_cuda(UpdateTensors{p, p, p, DType::bf16}, nullptr, 8, momentum, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("momentum_buf"));

  e = error_of([&] { sgd_update_cuda(UpdateTensors{p, p, p, static_cast<DType>(7)}, p, 8, momentum, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("unknown dtype"));

  e = error_of([&] { sgd_update_cuda(UpdateTensors{p, p, p, DType::bf16}, p, -3, momentum, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("negative element count -3"));

  // Empty ranges need no buffers and no device.
  REQUIRE_NOTHROW(adam_update_cuda(UpdateTensors{nullptr, nullptr, nullptr, DType::bf16}, nullptr, nullptr, nullptr, 0,
                                   adam, gt, r, nullptr));
  REQUIRE_NOTHROW(sgd_update_cuda(UpdateTensors{nullptr, nullptr, nullptr, DType::f16}, nullptr, 0, momentum, gt, r,
                                  nullptr));
}

TEST_CASE("grad_stats and the conversions check their arguments", "[cuda][api][mixed]") {
  std::vector<float> host(16, 0.f);
  float* p = host.data();
  double* out = reinterpret_cast<double*>(p);

  Error e = error_of([&] { grad_stats_cuda(p, DType::bf16, 8, 1.f, false, nullptr, false, nullptr, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`out` is null"));
  e = error_of([&] { grad_stats_cuda(nullptr, DType::bf16, 8, 1.f, false, out, false, nullptr, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { grad_stats_cuda(p, DType::f16, -1, 1.f, true, out, false, nullptr, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);

  e = error_of([&] { widen_cuda(nullptr, DType::bf16, p, 4, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { narrow_cuda(p, nullptr, DType::f16, 4, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { divide_cuda(static_cast<void*>(nullptr), DType::bf16, 4, 2.f, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { divide_cuda(static_cast<void*>(p), static_cast<DType>(9), 4, 2.f, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);

  REQUIRE_NOTHROW(widen_cuda(nullptr, DType::bf16, nullptr, 0, nullptr));
  REQUIRE_NOTHROW(narrow_cuda(nullptr, nullptr, DType::f16, 0, nullptr));
  REQUIRE_NOTHROW(divide_cuda(static_cast<void*>(nullptr), DType::bf16, 0, 2.f, nullptr));
}

TEST_CASE("the compact-state updates (q8 moments, master remainders) check their arguments before CUDA", "[cuda][api][q8]") {
  std::vector<float> host(16, 0.f);
  std::vector<uint8_t> codes(16, 0);
  std::vector<int16_t> remainders(16, 0);
  float* p = host.data();
  uint8_t* c = codes.data();
  AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, true, false, 1);
  const GradTransform gt;
  Rounding r;
  const Q8Moments q{c, c, p, p};

  Error e = error_of([&] { adam_update_q8_cuda(UpdateTensors{p, p, nullptr, DType::f32}, q, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("adam_update_q8_cuda: amsgrad keeps max_exp_avg_sq"));
  adam.amsgrad = false;

  e = error_of([&] {
    adam_update_q8_cuda(UpdateTensors{p, p, nullptr, DType::f32}, Q8Moments{c, nullptr, p, p}, 8, adam, gt, r, nullptr);
  });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`exp_avg_sq` is null"));

  e = error_of([&] {
    adam_update_q8_cuda(UpdateTensors{p, p, nullptr, DType::f32}, Q8Moments{c, c, p, nullptr}, 8, adam, gt, r, nullptr);
  });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`exp_avg_sq_absmax` is null"));

  // Remainders: bf16 only, in place of `master`, and never with stochastic rounding.
  UpdateTensors remainder_f16{p, p, nullptr, DType::f16};
  remainder_f16.master_remainder = remainders.data();
  e = error_of([&] { adam_update_cuda(remainder_f16, p, p, p, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("`master_remainder` holds the master of bf16 parameters"));

  UpdateTensors remainder_bf16{p, p, nullptr, DType::bf16};
  remainder_bf16.master_remainder = remainders.data();
  r.stochastic = true;
  e = error_of([&] { adam_update_q8_cuda(remainder_bf16, q, 8, adam, gt, r, nullptr); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("stochastic rounding cannot combine with `master_remainder`"));
  e = error_of([&] {
    sgd_update_cuda(remainder_bf16, p, 8, make_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, false, true), gt, r, nullptr);
  });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("sgd_update_cuda: stochastic rounding cannot combine"));
}
