// tests/capi/test_capi_averaging.cpp — model averaging through the C ABI: local SGD runs bitwise equal to the C++ API's, the averager's step, and save/load round trips.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"
#include "capi_averaging_support.hpp"

using shardopt_capi_test::last_error;
using namespace shardopt_capi_averaging_test;

// ---- the C ABI gives the C++ API's bits ------------------------------------------------------------

TEST_CASE("post-local SGD through the C ABI is bitwise the C++ API's run", "[capi][averaging]") {
  const int size = shardopt_test::world()->size();
  constexpr int kSteps = 9;
  for (const auto& [name, setting] : settings(size)) {
    INFO(name);
    const Outcome cpp = run_cpp(setting, kSteps, true);
    const Outcome c = run_c(setting, kSteps, true);
    CHECK(same(cpp, c));
    CHECK(c.averager_step == kSteps);
    CHECK(c.counts.averages > 0);
    // The averaging changed the parameters: without it (the same warmup, then no averaging in
    // these steps) the replicas end elsewhere.
    if (size > 1) {
      Setting never = setting;
      never.levels = {{1000, 0}};
      never.hierarchical = false;
      never.outer = false;
      CHECK_FALSE(shardopt_test::bitwise_equal(run_c(never, kSteps, true).params, c.params));
    }
  }
}

TEST_CASE("a model averager through the C ABI is bitwise the C++ API's", "[capi][averaging]") {
  const int size = shardopt_test::world()->size();
  constexpr int kSteps = 7;
  for (const auto& [name, setting] : settings(size)) {
    INFO(name);
    const Outcome cpp = run_cpp(setting, kSteps, false);
    const Outcome c = run_c(setting, kSteps, false);
    CHECK(same(cpp, c));
    CHECK(c.averager_step == kSteps);
  }
}

TEST_CASE("the averager's step can be read and set through the C ABI", "[capi][averaging]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  const Setting setting{{{4, 0}}, 0, false, false};
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = setting.c(levels);
  shardopt_model_averager_t averager = nullptr;
  CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
  int64_t step = -1;
  int32_t next = -1;
  CAPI_OK(shardopt_model_averager_step(averager, &step));
  CHECK(step == 0);
  CAPI_OK(shardopt_model_averager_set_step(averager, 3));
  CAPI_OK(shardopt_model_averager_step(averager, &step));
  CHECK(step == 3);
  // Step 3 is no multiple of the period, step 4 is: torch's rule, (step - warmup) % period.
  CAPI_OK(shardopt_model_averager_next_group_size(averager, &next));
  CHECK(next == 0);
  CAPI_OK(shardopt_model_averager_set_step(averager, 4));
  CAPI_OK(shardopt_model_averager_next_group_size(averager, &next));
  CHECK(next == comms.size);
  CAPI_OK(shardopt_model_averager_average_parameters(averager));
  CAPI_OK(shardopt_model_averager_step(averager, &step));
  CHECK(step == 5);
  CAPI_OK(shardopt_model_averager_destroy(averager));

  shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, setting);
  CAPI_OK(shardopt_post_local_sgd_set_averager_step(plsgd, 8));
  CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &step));
  CHECK(step == 8);
  CAPI_OK(shardopt_post_local_sgd_next_group_size(plsgd, &next));
  CHECK(next == comms.size);
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

// ---- checkpoints and state dicts --------------------------------------------------------------------

TEST_CASE("post-local SGD saves and loads through the C ABI, the outer optimizer included", "[capi][averaging][checkpoint]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  const Setting setting{{{2, 0}}, 1, false, true};
  shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, setting);
  const std::string dir = std::string(SHARDOPT_CAPI_SCRATCH) + "/averaging_np" + std::to_string(comms.size);

  train_c(plsgd, opt, 0, 5, comms.rank);
  CAPI_OK(shardopt_post_local_sgd_save(plsgd, dir.c_str()));
  const std::vector<float> saved = params_c(opt);
  int64_t saved_step = -1;
  CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &saved_step));
  CHECK(saved_step == 5);

  train_c(plsgd, opt, 5, 9, comms.rank);
  const std::vector<float> continued = params_c(opt);
  CHECK_FALSE(shardopt_test::bitwise_equal(continued, saved));

  CAPI_OK(shardopt_post_local_sgd_load(plsgd, dir.c_str()));
  CHECK(shardopt_test::bitwise_equal(params_c(opt), saved));
  int64_t step = -1;
  CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &step));
  CHECK(step == saved_step);
  // The same steps again from the checkpoint give the same bits: the optimizer state, the
  // averager's step and the outer optimizer's state all came back.
  train_c(plsgd, opt, 5, 9, comms.rank);
  CHECK(shardopt_test::bitwise_equal(params_c(opt), continued));

  // A fresh optimizer and post-local SGD over it, loaded from the checkpoint, continue alike.
  CModel other_model;
  shardopt_optimizer_t other = other_model.create(comms.replica);
  shardopt_post_local_sgd_t resumed = create_plsgd(comms, other, setting);
  CAPI_OK(shardopt_post_local_sgd_load(resumed, dir.c_str()));
  train_c(resumed, other, 5, 9, comms.rank);
  CHECK(shardopt_test::bitwise_equal(params_c(other), continued));

  // A directory with no checkpoint is refused, and the state stays.
  const std::string missing = dir + "_missing";
  CHECK(shardopt_post_local_sgd_load(resumed, missing.c_str()) != SHARDOPT_OK);
  CHECK(contains(last_error(), "shardopt_post_local_sgd_load: "));
  CHECK(shardopt_test::bitwise_equal(params_c(other), continued));

  CAPI_OK(shardopt_post_local_sgd_destroy(resumed));
  CAPI_OK(shardopt_optimizer_destroy(other));
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

TEST_CASE("the consolidated state dict's step is the averager's", "[capi][averaging][checkpoint]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, Setting{{{2, 0}}, 0, false, false});
  int32_t has_step = -1;
  int64_t step = -1;
  // Nothing consolidated here yet: refused, as the C++ state_dict() refuses it.
  CHECK(shardopt_post_local_sgd_state_dict_step(plsgd, &has_step, &step) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "shardopt_post_local_sgd_state_dict_step: "));
  train_c(plsgd, opt, 0, 3, comms.rank);
  // Every rank is rank 0 of its one-rank replica.
  CAPI_OK(shardopt_post_local_sgd_consolidate_state_dict(plsgd, 0));
  CAPI_OK(shardopt_post_local_sgd_state_dict_step(plsgd, &has_step, &step));
  CHECK(has_step == 1);
  CHECK(step == 3);
  CHECK(shardopt_post_local_sgd_state_dict_step(plsgd, nullptr, &step) == SHARDOPT_ERR_NULL_POINTER);
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  CAPI_OK(shardopt_optimizer_destroy(opt));
}
