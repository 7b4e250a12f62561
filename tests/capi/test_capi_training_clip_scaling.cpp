// tests/capi/test_capi_training_clip_scaling.cpp — the C ABI's clip_grad_norm against hand-computed norms, and loss scaling with skipped steps.
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

// ---- clip_grad_norm ---------------------------------------------------------------------------------

TEST_CASE("clip_grad_norm returns the total norm and the next step applies the clip factor", "[capi][clip]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 128, 1};  // P = 171 elements
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.bucket_bytes = 64;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 1.0;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  auto fill_grads = [&](float value) {
    for (int32_t id = 0; id < 4; ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      std::fill(static_cast<float*>(view.data), static_cast<float*>(view.data) + view.numel, value);
    }
  };

  // Every gradient 1.0 on every rank: the average is 1.0 and the 2-norm sqrt(171).
  fill_grads(1.0f);
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  double norm = -1.0;
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, &norm) == SHARDOPT_OK);
  CHECK(norm == Approx(std::sqrt(171.0)).epsilon(1e-6));
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  const double coef = 1.0 / (std::sqrt(171.0) + 1e-6);
  shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1.0);
  CHECK(report.grad_norm == norm);
  CHECK(report.clip_coef == Approx(coef).epsilon(1e-6));
  CHECK(report.skipped_steps == 0);
  // SGD, lr 1: each weight moved by exactly the clip factor; the gradients kept their values.
  for (int32_t id = 0; id < 4; ++id) {
    const std::vector<float> now = param_values<float>(opt, id);
    for (std::size_t i = 0; i < now.size(); ++i) {
      CHECK(now[i] == Approx(model.values[static_cast<std::size_t>(id)][i] - coef).margin(1e-6));
    }
    shardopt_tensor g{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
    CHECK(static_cast<float*>(g.data)[0] == 1.0f);
  }

  // One element -4, the rest 1: 2-norm sqrt(170 + 16), inf-norm 4; a max_norm above the norm
  // leaves the gradients alone (factor 1).
  fill_grads(1.0f);
  {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_grad_view(opt, 2, &view) == SHARDOPT_OK);
    static_cast<float*>(view.data)[5] = -4.0f;
  }
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1e6, 2.0, &norm) == SHARDOPT_OK);
  CHECK(norm == Approx(std::sqrt(186.0)).epsilon(1e-6));
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 100.0, std::numeric_limits<double>::infinity(), &norm) ==
          SHARDOPT_OK);
  CHECK(norm == 4.0);
  const std::vector<float> before = param_values<float>(opt, 2);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.grad_norm == 4.0);
  CHECK(report.clip_coef == 1.0);
  const std::vector<float> after = param_values<float>(opt, 2);
  CHECK(after[5] == before[5] + 4.0f);
  CHECK(after[0] == before[0] - 1.0f);

  // Without clip_grad_norm before it, a step reports no norm; out_norm may be NULL.
  fill_grads(0.0f);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.grad_norm == -1.0);
  CHECK(report.clip_coef == 1.0);
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, nullptr) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("clip_grad_norm and last_step refusals come back as statuses with messages", "[capi][clip][errors]") {
  CommHandle comm;
  Model32 model({8});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  shardopt_optimizer_t opt = create(comm, config, group);
  double norm = 12345.0;
  for (double norm_type : {1.0, 0.0, 3.0, -std::numeric_limits<double>::infinity()}) {
    CHECK(shardopt_optimizer_clip_grad_norm(opt, 1.0, norm_type, &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    CHECK(contains(last_error(), "shardopt_optimizer_clip_grad_norm: "));
    CHECK(contains(last_error(), "is not supported (2 or inf)"));
  }
  CHECK(contains(last_error(), "norm_type -inf"));
  CHECK(shardopt_optimizer_clip_grad_norm(opt, 1.0, std::nan(""), &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(shardopt_optimizer_clip_grad_norm(opt, -1.0, 2.0, &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "max_norm"));
  CHECK(shardopt_optimizer_clip_grad_norm(opt, std::numeric_limits<double>::infinity(), 2.0, &norm) ==
        SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(norm == 12345.0);  // untouched by refused calls
  CHECK(shardopt_optimizer_clip_grad_norm(nullptr, 1.0, 2.0, &norm) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_optimizer_clip_grad_norm: opt is NULL;"));

  // A refused clip leaves no factor behind.
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  shardopt_step_report report = last_step(opt);
  CHECK(report.grad_norm == -1.0);
  CHECK(report.clip_coef == 1.0);

  CHECK(shardopt_optimizer_last_step(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_last_step: out is NULL");
  report.struct_size = 0;
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is 0"));
  CHECK(contains(last_error(), "shardopt_step_report_init()"));
  report.struct_size = sizeof(report) + 8;
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  shardopt_step_report_init(&report);
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_BAD_HANDLE);
}

// ---- loss scaling -----------------------------------------------------------------------------------

TEST_CASE("loss scaling over f16 parameters: the scale grows, an inf on one rank skips the step everywhere",
          "[capi][loss_scaling]") {
  CommHandle comm;
  const int rank = comm.rank(), last = comm.size() - 1;
  const std::vector<int64_t> sizes = {40, 3};
  std::vector<std::vector<uint16_t>> initial;
  for (int64_t n : sizes) initial.emplace_back(static_cast<std::size_t>(n), f16_of(1.0f));
  Model16 model(sizes, SHARDOPT_DTYPE_F16, false, initial);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.loss_scaling.enabled = 1;
  config.loss_scaling.init_scale = 1024.0;
  config.loss_scaling.growth_interval = 2;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.25;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);
  CHECK(loss_scale(opt) == 1024.0);

  // No reduce_gradients: every rank writes the same gradient (so it is its own average), except
  // where one rank injects an inf that only it sees, so the step's own agreement must spread it.
  // Each rank checks the gradients of its shard: rank 0 gets the inf at the first param's 4th
  // element (its shard starts the flat partition), the last rank at the very last element.
  // Scaled gradients 0.5 * scale unscale to 0.5; SGD lr 0.25 moves each weight by 0.125,
  // exactly in f16.
  auto write_grads = [&](double scale, int inf_rank) {
    for (int32_t id = 0; id < 2; ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      REQUIRE(view.dtype == SHARDOPT_DTYPE_F16);
      uint16_t* g = static_cast<uint16_t*>(view.data);
      std::fill(g, g + view.numel, f16_of(static_cast<float>(0.5 * scale)));
      if (rank != inf_rank) continue;
      if (inf_rank == 0 && id == 0) g[3] = kF16Inf;
      if (inf_rank != 0 && id == 1) g[view.numel - 1] = kF16Inf;
    }
  };
  auto all_params_are = [&](float expected) {
    for (int32_t id = 0; id < 2; ++id) {
      for (uint16_t v : param_values<uint16_t>(opt, id)) CHECK(float_of_f16(v) == expected);
    }
  };

  write_grads(1024.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.875f);
  shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1024.0);
  CHECK(report.skipped_steps == 0);
  CHECK(loss_scale(opt) == 1024.0);  // one clean step of the two before growth

  write_grads(1024.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.75f);
  CHECK(loss_scale(opt) == 2048.0);  // grown after growth_interval clean steps

  // An inf on rank 0 only: every rank skips (no update, no step count), the scale backs off.
  write_grads(2048.0, 0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.skipped == 1);
  CHECK(report.loss_scale == 2048.0);
  CHECK(report.skipped_steps == 1);
  CHECK(loss_scale(opt) == 1024.0);
  all_params_are(0.75f);
  int64_t steps = 0;
  REQUIRE(shardopt_optimizer_param_step(opt, 0, &steps) == SHARDOPT_OK);
  CHECK(steps == 2);

  // Resuming at another scale; the gradients follow it.
  REQUIRE(shardopt_optimizer_set_loss_scale(opt, 512.0) == SHARDOPT_OK);
  CHECK(loss_scale(opt) == 512.0);
  write_grads(512.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.625f);
  report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 512.0);
  CHECK(report.grad_norm == -1.0);

  // An inf on the last rank seen by clip_grad_norm first: the norm is NaN on every rank, and
  // the step is skipped.
  write_grads(512.0, last);
  double norm = 0.0;
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, &norm) == SHARDOPT_OK);
  CHECK(std::isnan(norm));
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.skipped == 1);
  CHECK(report.skipped_steps == 2);
  CHECK(std::isnan(report.grad_norm));
  CHECK(loss_scale(opt) == 256.0);
  all_params_are(0.625f);

  // Refused scales leave the scale as it was.
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    CHECK(shardopt_optimizer_set_loss_scale(opt, bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "shardopt_optimizer_set_loss_scale: "));
    CHECK(contains(last_error(), "must be finite and > 0"));
  }
  CHECK(loss_scale(opt) == 256.0);
  CHECK(shardopt_optimizer_loss_scale(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_loss_scale: out is NULL");
  CHECK(shardopt_optimizer_set_loss_scale(nullptr, 2.0) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("without loss scaling the scale is 1 and cannot be set; bad loss_scaling fields are refused",
          "[capi][loss_scaling][errors]") {
  CommHandle comm;
  Model32 model({8});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  // Disabled: the other fields are ignored, however wrong.
  config.loss_scaling.init_scale = -5.0;
  config.loss_scaling.growth_interval = 0;
  shardopt_optimizer_t opt = create(comm, config, group);
  CHECK(loss_scale(opt) == 1.0);
  CHECK(shardopt_optimizer_set_loss_scale(opt, 8.0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "loss scaling is not enabled"));
  CHECK(loss_scale(opt) == 1.0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  const shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1.0);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  struct Case {
    void (*change)(shardopt_loss_scaling&);
    const char* message;
  };
  const Case cases[] = {
      {[](shardopt_loss_scaling& l) { l.init_scale = 0.0; }, "config->loss_scaling.init_scale must be finite and > 0, got 0"},
      {[](shardopt_loss_scaling& l) { l.init_scale = std::numeric_limits<double>::infinity(); }, "init_scale must be finite"},
      {[](shardopt_loss_scaling& l) { l.growth_factor = 1.0; }, "config->loss_scaling.growth_factor must be finite and > 1, got 1"},
      {[](shardopt_loss_scaling& l) { l.backoff_factor = 1.0; }, "config->loss_scaling.backoff_factor must be in (0, 1), got 1"},
      {[](shardopt_loss_scaling& l) { l.backoff_factor = 0.0; }, "backoff_factor must be in (0, 1)"},
      {[](shardopt_loss_scaling& l) { l.growth_interval = 0; }, "config->loss_scaling.growth_interval must be > 0, got 0"},
      {[](shardopt_loss_scaling& l) { l.min_scale = 1e9; }, "config->loss_scaling.min_scale must be finite, > 0 and <= init_scale"},
      {[](shardopt_loss_scaling& l) { l.min_scale = std::nan(""); }, "min_scale must be finite"},
  };
  for (const Case& c : cases) {
    shardopt_optimizer_config_init(&config);
    config.loss_scaling.enabled = 1;
    c.change(config.loss_scaling);
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    CHECK(contains(last_error(), std::string("shardopt_optimizer_create: ")));
    CHECK(contains(last_error(), c.message));
    CHECK(opt == nullptr);
  }
}
