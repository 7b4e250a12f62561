// tests/mpi/test_agreement_arguments.cpp — the same collective call with different arguments on one rank (config, hyperparameters, registrations, call arguments) fails on every rank naming the field and both values.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "mpi_test_support.hpp"
#include "shardopt/checkpoint.hpp"
#include "agreement_test_support.hpp"

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;
using namespace shardopt_agreement_test;

// ---- the same call with different arguments ------------------------------------------------

TEST_CASE("a config field that differs on one rank is named with both values on every rank", "[agreement][config]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Params params(kSmall);
  struct Case {
    std::string field, first, other;
    std::function<void(OptimizerConfig&)> base;    // every rank
    std::function<void(OptimizerConfig&)> differ;  // the last rank only
  };
  auto none = [](OptimizerConfig&) {};
  auto scaling = [](OptimizerConfig& c) { c.loss_scaling.enabled = true; };
  auto with_defaults = [](OptimizerConfig& c) { c.defaults = Hyperparams{}; };
  const OptimizerConfig d;
  const std::vector<Case> cases = {
      {"config.algorithm", "adam", "sgd", none, [](OptimizerConfig& c) { c.algorithm = Algorithm::sgd; }},
      {"config.partition", "flat", "sorted_greedy", none,
       [](OptimizerConfig& c) { c.partition = PartitionStrategy::sorted_greedy; }},
      {"config.storage", "bucket_view", "external", none, [](OptimizerConfig& c) { c.storage = Storage::external; }},
      {"config.shard_state", "true", "false", none, [](OptimizerConfig& c) { c.shard_state = false; }},
      {"config.bucket_bytes", num(static_cast<double>(d.bucket_bytes)), "64", none,
       [](OptimizerConfig& c) { c.bucket_bytes = 64; }},
      {"config.pipeline_chunk_bytes", "0", "256", none, [](OptimizerConfig& c) { c.pipeline_chunk_bytes = 256; }},
      {"config.stage", "1", "2", none, [](OptimizerConfig& c) { c.stage = 2; }},
      {"config.stochastic_rounding", "false", "true", none, [](OptimizerConfig& c) { c.stochastic_rounding = true; }},
      {"config.rounding_seed", "0", "7", none, [](OptimizerConfig& c) { c.rounding_seed = 7; }},
      {"config.loss_scaling.enabled", "false", "true", none, scaling},
      {"config.loss_scaling.init_scale", num(65536.0), num(1024.0), scaling,
       [](OptimizerConfig& c) { c.loss_scaling.init_scale = 1024.0; }},
      {"config.loss_scaling.growth_factor", num(2.0), num(4.0), scaling,
       [](OptimizerConfig& c) { c.loss_scaling.growth_factor = 4.0; }},
      {"config.loss_scaling.backoff_factor", num(0.5), num(0.25), scaling,
       [](OptimizerConfig& c) { c.loss_scaling.backoff_factor = 0.25; }},
      {"config.loss_scaling.growth_interval", "2000", "100", scaling,
       [](OptimizerConfig& c) { c.loss_scaling.growth_interval = 100; }},
      {"config.loss_scaling.min_scale", num(1.0), num(2.0), scaling,
       [](OptimizerConfig& c) { c.loss_scaling.min_scale = 2.0; }},
      {"config.defaults.lr", num(1e-3), num(2e-3), with_defaults, [](OptimizerConfig& c) { c.defaults->lr = 2e-3; }},
      {"config.defaults.beta2", num(0.999), num(0.99), with_defaults,
       [](OptimizerConfig& c) { c.defaults->beta2 = 0.99; }},
      {"config.defaults.amsgrad", "false", "true", with_defaults,
       [](OptimizerConfig& c) { c.defaults->amsgrad = true; }},
  };
  // The groups set every hyperparameter themselves, so that only the config differs.
  const GroupHyperparams full = Hyperparams{};
  for (const Case& c : cases) {
    CAPTURE(c.field);
    OptimizerConfig config;
    c.base(config);
    if (me == last) c.differ(config);
    const bool external = config.storage == Storage::external;
    const Outcome o = outcome_of([&] { ZeroOptimizer(comm, config, {params.all(full, external)}); });
    check_disagree(o, c.field, c.first, last, c.other);
    if (!o.threw || o.code == ErrorCode::timeout) break;
  }
}

TEST_CASE("cpu_threads may differ between ranks", "[agreement][config]") {
  auto comm = test_comm();
  const int me = comm->rank();
  Params params(kSmall);
  OptimizerConfig config;
  config.cpu_threads = me == 0 ? 0 : 1;
  const Outcome o = outcome_of([&] {
    ZeroOptimizer opt(comm, config, {params.all()});
    write_grads(opt, 0);
    opt.step();
    CHECK(opt.param_step(0) == 1);
  });
  INFO(o.what);
  CHECK_FALSE(o.threw);
  CHECK(o.seconds < kFastSeconds);
}

TEST_CASE("a group hyperparameter that differs at construction or add_param_group is named", "[agreement][hyper]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Params params({{"a", 12}, {"b", 20}, {"c", 6}});
  GroupHyperparams hyper;
  hyper.lr = me == last ? 0.02 : 0.01;
  Outcome o = outcome_of([&] { ZeroOptimizer(comm, OptimizerConfig{}, {params.group(0, 2, hyper)}); });
  check_disagree(o, "param group 0 lr", num(0.01), last, num(0.02));

  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.group(0, 2)});
  GroupHyperparams later;
  later.beta2 = me == last ? 0.99 : 0.999;
  o = outcome_of([&] { opt.add_param_group(params.group(2, 3, later)); });
  check_disagree(o, "param group 1 beta2", num(0.999), last, num(0.99));
  CHECK(opt.num_groups() == 1);
  CHECK(opt.num_params() == 2);
  write_grads(opt, 0);
  o = outcome_of([&] { opt.step(); });  // still usable, and every rank is in step()
  CHECK_FALSE(o.threw);
}

TEST_CASE("a hyperparameter changed on one rank fails the next step everywhere and changes nothing", "[agreement][hyper]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  auto solo = comm->split(me, 0);
  struct Case {
    std::string name;
    Algorithm algorithm;
    std::string before, after;
    std::function<void(Hyperparams&)> change;
  };
  const std::vector<Case> cases = {
      {"lr", Algorithm::adam, num(0.01), num(0.02), [](Hyperparams& h) { h.lr = 0.02; }},
      {"beta1", Algorithm::adam, num(0.9), num(0.8), [](Hyperparams& h) { h.beta1 = 0.8; }},
      {"beta2", Algorithm::adam, num(0.999), num(0.99), [](Hyperparams& h) { h.beta2 = 0.99; }},
      {"eps", Algorithm::adam, num(1e-8), num(1e-6), [](Hyperparams& h) { h.eps = 1e-6; }},
      {"weight_decay", Algorithm::adamw, num(0.02), num(0.03), [](Hyperparams& h) { h.weight_decay = 0.03; }},
      {"maximize", Algorithm::adam, "false", "true", [](Hyperparams& h) { h.maximize = true; }},
      {"amsgrad", Algorithm::adam, "true", "false", [](Hyperparams& h) { h.amsgrad = false; }},
      {"momentum", Algorithm::sgd, num(0.9), num(0.8), [](Hyperparams& h) { h.momentum = 0.8; }},
      {"dampening", Algorithm::sgd, num(0.0), num(0.1), [](Hyperparams& h) { h.dampening = 0.1; }},
      {"nesterov", Algorithm::sgd, "false", "true", [](Hyperparams& h) { h.nesterov = true; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Hyperparams hyper;
    if (c.algorithm == Algorithm::sgd) {
      hyper.lr = 0.05;
      hyper.momentum = 0.9;
      hyper.weight_decay = 0.01;
    } else {
      hyper.lr = 0.01;
      hyper.weight_decay = 0.02;
      hyper.amsgrad = true;
    }
    OptimizerConfig config;
    config.algorithm = c.algorithm;
    config.bucket_bytes = 64;
    Params params(kSmall, 11);
    ZeroOptimizer opt(comm, config, {params.group(0, 2, hyper), params.group(2, 3, hyper)});
    const std::vector<float> before = all_params(opt);
    write_grads(opt, 0);
    if (me == last) c.change(opt.hyperparams(0));
    const Outcome o = outcome_of([&] { opt.step(); });
    check_disagree(o, "param group 0 " + c.name, c.before, last, c.after);
    CHECK(bitwise_equal(all_params(opt), before));  // nothing moved, on any rank
    CHECK(opt.param_step(0) == 0);
    if (!o.threw || o.code == ErrorCode::timeout) break;

    // Fixed, the next step is the first step a single rank takes.
    opt.hyperparams(0) = hyper;
    write_grads(opt, 0);
    const Outcome again = outcome_of([&] { opt.step(); });
    INFO(again.what);
    CHECK_FALSE(again.threw);
    Params solo_params(kSmall, 11);
    ZeroOptimizer reference(solo, config, {solo_params.group(0, 2, hyper), solo_params.group(2, 3, hyper)});
    write_grads(reference, 0);
    reference.step();
    CHECK(bitwise_equal(all_params(opt), all_params(reference)));
    CHECK_FALSE(bitwise_equal(all_params(opt), before));

    // Checked at every step, not only the first.
    const std::vector<float> after_one = all_params(opt);
    write_grads(opt, 1);
    if (me == last) c.change(opt.hyperparams(0));
    const Outcome later = outcome_of([&] { opt.step(); });
    check_disagree(later, "param group 0 " + c.name, c.before, last, c.after);
    CHECK(bitwise_equal(all_params(opt), after_one));
    CHECK(opt.param_step(0) == 1);
  }
}

TEST_CASE("registrations that differ name the parameter and both descriptions", "[agreement][registration]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  std::vector<std::pair<std::string, int64_t>> spec = {{"embed", 10}, {"fc.weight", 9}, {"fc.bias", 3}};
  if (me == last) spec[1].second = 8;
  Params params(spec);
  Outcome o = outcome_of([&] { ZeroOptimizer(comm, OptimizerConfig{}, {params.all()}); });
  check_disagree(o, "parameter #1", "'fc.weight' (numel 9, f32, cpu, group 0)", last,
                 "'fc.weight' (numel 8, f32, cpu, group 0)");

  Params base({{"w", 5}, {"extra", 4}, {"other", 4}});
  ZeroOptimizer opt(comm, OptimizerConfig{}, {base.group(0, 1)});
  o = outcome_of([&] { opt.add_param_group(me == last ? base.group(2, 3) : base.group(1, 2)); });
  check_error(o, ErrorCode::mismatch,
              {"ranks disagree on parameter #", "rank 0 has 'extra' (numel 4, f32, cpu, group 1)",
               "rank " + std::to_string(last) + " has 'other' (numel 4, f32, cpu, group 1)"});
  CHECK(opt.num_params() == 1);
  CHECK(opt.num_groups() == 1);
}

TEST_CASE("set_trainable / clip_grad_norm / consolidate_state_dict arguments must agree", "[agreement][arguments]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Params params({{"layer.first", 16}, {"layer.second", 24}, {"head", 8}});
  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.all()});

  Outcome o = outcome_of([&] { opt.set_trainable(me == last ? 1 : 0, false); });
  check_error(o, ErrorCode::mismatch,
              {"ranks disagree on set_trainable parameter", "rank 0 has ", "layer.first",
               "rank " + std::to_string(last) + " has ", "layer.second"});
  CHECK(opt.trainable(0));
  CHECK(opt.trainable(1));

  o = outcome_of([&] { opt.set_trainable(2, me == last); });
  check_disagree(o, "set_trainable value", "false", last, "true");
  CHECK(opt.trainable(2));

  write_grads(opt, 0);
  o = outcome_of([&] { opt.clip_grad_norm(me == last ? 2.0 : 1.0); });
  check_disagree(o, "max_norm", num(1.0), last, num(2.0));
  const double inf = std::numeric_limits<double>::infinity();
  o = outcome_of([&] { opt.clip_grad_norm(1.0, me == last ? inf : 2.0); });
  check_disagree(o, "norm_type", num(2.0), last, num(inf));

  o = outcome_of([&] { opt.consolidate_state_dict(me == last ? last : 0); });
  check_disagree(o, "target rank", "0", last, std::to_string(last));

  // Agreeing again, everything works.
  o = outcome_of([&] {
    opt.clip_grad_norm(1.0);
    opt.step();
    opt.consolidate_state_dict(0);
  });
  INFO(o.what);
  CHECK_FALSE(o.threw);
}
