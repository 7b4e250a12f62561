// tests/capi/test_capi_muon.cpp — the C ABI passes a group's algorithm, Muon's hyperparameters and parameter shapes through: bitwise the C++ API's optimizer.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include <mpi.h>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"

namespace {

using shardopt_capi_test::CommHandle;

const int64_t kMatrix[2] = {6, 4};
constexpr int64_t kVector = 10;

std::vector<float> values(uint32_t seed, int64_t n) { return shardopt_test::seeded_values(seed, n); }

// Two groups: AdamW over a vector, Muon over a 6 x 4 matrix (lr 0.02, match_rms_adamw).
std::vector<float> run_c(int steps) {
  CommHandle comm(20);
  std::vector<float> w = values(1, 24), b = values(2, kVector);
  shardopt_param_desc params[2];
  shardopt_param_desc_init(&params[0]);
  params[0].name = "b";
  params[0].param = shardopt_tensor{b.data(), kVector, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  shardopt_param_desc_init(&params[1]);
  params[1].name = "w";
  params[1].param = shardopt_tensor{w.data(), 24, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  params[1].shape = kMatrix;
  params[1].ndim = 2;
  shardopt_hyperparams muon;
  shardopt_hyperparams_init(&muon);
  REQUIRE(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_MUON, &muon) == SHARDOPT_OK);
  REQUIRE(muon.momentum == 0.95);
  REQUIRE(muon.nesterov == 1);
  muon.lr = 0.02;
  muon.adjust_lr_fn = SHARDOPT_MUON_LR_ADJUST_MATCH_RMS_ADAMW;
  shardopt_param_group_desc groups[2];
  shardopt_param_group_desc_init(&groups[0]);
  groups[0].params = &params[0];
  groups[0].num_params = 1;
  groups[0].algorithm = SHARDOPT_ALGORITHM_ADAMW;
  shardopt_param_group_desc_init(&groups[1]);
  groups[1].params = &params[1];
  groups[1].num_params = 1;
  groups[1].hyperparams = &muon;
  groups[1].algorithm = SHARDOPT_ALGORITHM_MUON;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.muon_precision = SHARDOPT_MATRIX_PRECISION_F32;
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), &config, groups, 2, &opt) == SHARDOPT_OK);
  for (int s = 0; s < steps; ++s) {
    for (int32_t id = 0; id < 2; ++id) {
      shardopt_tensor g;
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
      const std::vector<float> v = values(100u + static_cast<uint32_t>(s * 2 + id), g.numel);
      std::memcpy(g.data, v.data(), v.size() * sizeof(float));
    }
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  std::vector<float> out;
  for (int32_t id = 0; id < 2; ++id) {
    shardopt_tensor p;
    REQUIRE(shardopt_optimizer_param_view(opt, id, &p) == SHARDOPT_OK);
    out.insert(out.end(), static_cast<float*>(p.data), static_cast<float*>(p.data) + p.numel);
  }
  // A Muon group's parameter without a 2-D shape is refused by name.
  params[1].ndim = 0;
  shardopt_optimizer_t refused = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), &config, groups, 2, &refused) == SHARDOPT_ERR_INVALID_ARGUMENT);
  REQUIRE_THAT(shardopt_capi_test::last_error(), Catch::Contains("'w'") && Catch::Contains("2-D parameters only"));
  shardopt_optimizer_destroy(opt);
  return out;
}

std::vector<float> run_cpp(int steps) {
  using namespace shardopt;
  std::vector<float> w = values(1, 24), b = values(2, kVector);
  ParamGroupSpec adamw, muon;
  adamw.settings.algorithm = Algorithm::adamw;
  adamw.params.push_back(ParamSpec{"b", TensorRef{b.data(), kVector}, TensorRef{}});
  muon.settings.algorithm = Algorithm::muon;
  muon.hyper.lr = 0.02;
  muon.hyper.adjust_lr_fn = MuonLrAdjust::match_rms_adamw;
  muon.params.push_back(ParamSpec{"w", TensorRef{w.data(), 24}, TensorRef{}, {6, 4}});
  OptimizerConfig config;
  config.muon.precision = MatrixPrecision::f32;
  ZeroOptimizer opt(shardopt_test::world(), {adamw, muon}, config);
  for (int s = 0; s < steps; ++s) {
    for (ParamId id = 0; id < 2; ++id) {
      const TensorRef g = opt.grad_view(id);
      const std::vector<float> v = values(100u + static_cast<uint32_t>(s * 2 + id), g.numel);
      std::memcpy(g.data, v.data(), v.size() * sizeof(float));
    }
    opt.step();
  }
  return shardopt_test::all_params(opt);
}

}  // namespace

TEST_CASE("C ABI: a Muon group beside an AdamW group steps bitwise as the C++ API", "[capi][muon]") {
  const std::vector<float> c = run_c(3);
  REQUIRE(shardopt_test::bitwise_equal(c, run_cpp(3)));
  REQUIRE_FALSE(shardopt_test::bitwise_equal(c, [] {
    std::vector<float> initial = values(2, kVector), w = values(1, 24);
    initial.insert(initial.end(), w.begin(), w.end());
    return initial;
  }()));
}

TEST_CASE("C ABI: the step report carries the Newton-Schulz time; the struct through sync_seconds is filled without it",
          "[capi][muon][versions]") {
  CommHandle comm(20);
  // Two 48 x 32 matrices: at np 2 and 3 some rank owns none and orthogonalises nothing.
  std::vector<float> w0 = values(5, 48 * 32), w1 = values(6, 48 * 32);
  const int64_t shape[2] = {48, 32};
  shardopt_param_desc params[2];
  float* data[2] = {w0.data(), w1.data()};
  for (int i = 0; i < 2; ++i) {
    shardopt_param_desc_init(&params[i]);
    params[i].name = i == 0 ? "w0" : "w1";
    params[i].param = shardopt_tensor{data[i], 48 * 32, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
    params[i].shape = shape;
    params[i].ndim = 2;
  }
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = params;
  group.num_params = 2;
  group.algorithm = SHARDOPT_ALGORITHM_MUON;
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  shardopt_step_report report;
  shardopt_step_report_init(&report);
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  CHECK(report.newton_schulz_seconds == 0.0);  // before any step
  for (int32_t id = 0; id < 2; ++id) {
    shardopt_tensor g;
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
    const std::vector<float> v = values(200u + static_cast<uint32_t>(id), g.numel);
    std::memcpy(g.data, v.data(), v.size() * sizeof(float));
  }
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  std::memset(&report, 0xff, sizeof report);  // NaNs: whatever is not written shows
  report.struct_size = sizeof report;
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  CHECK(report.newton_schulz_seconds >= 0.0);
  CHECK(report.newton_schulz_seconds <= report.update_seconds);
  // Every matrix is orthogonalised once, by its owner: the ranks' times sum to more than 0.
  double total = 0.0;
  MPI_Allreduce(&report.newton_schulz_seconds, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total > 0.0);
  CHECK(total < 60.0);

  // The struct of the previous version (through sync_seconds): the phases written, not the new field.
  shardopt_step_report earlier;
  std::memset(&earlier, 0xff, sizeof earlier);
  earlier.struct_size = offsetof(shardopt_step_report, newton_schulz_seconds);
  REQUIRE(shardopt_optimizer_last_step(opt, &earlier) == SHARDOPT_OK);
  CHECK(earlier.update_seconds == report.update_seconds);
  CHECK(std::isnan(earlier.newton_schulz_seconds));
  earlier.struct_size = offsetof(shardopt_step_report, newton_schulz_seconds) + 4;
  CHECK(shardopt_optimizer_last_step(opt, &earlier) == SHARDOPT_ERR_STRUCT_SIZE);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
