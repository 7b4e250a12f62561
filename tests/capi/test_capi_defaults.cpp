// tests/capi/test_capi_defaults.cpp — optimizer-level defaults in the C ABI: groups with NULL hyperparams take config->defaults or torch's per-algorithm defaults, at create and in add_param_group.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi_test_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// One bucket-view param per group, named by the group.
struct OneParam {
  std::string name;
  std::vector<float> values;
  shardopt_param_desc desc;

  OneParam(std::string n, int64_t numel) : name(std::move(n)), values(static_cast<std::size_t>(numel), 0.5f) {
    shardopt_param_desc_init(&desc);
    desc.name = name.c_str();
    desc.param.data = values.data();
    desc.param.numel = numel;
  }
  OneParam(const OneParam&) = delete;
  OneParam& operator=(const OneParam&) = delete;

  shardopt_param_group_desc group(const shardopt_hyperparams* hyper = nullptr) const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = &desc;
    g.num_params = 1;
    g.hyperparams = hyper;
    return g;
  }
};

// Every field garbage (NaN, -1 booleans): whatever a getter leaves unwritten shows.
shardopt_hyperparams poisoned() {
  shardopt_hyperparams h;
  std::memset(&h, 0xff, sizeof h);
  h.struct_size = sizeof h;
  return h;
}

shardopt_hyperparams hyperparams_of(shardopt_optimizer_t opt, int32_t group) {
  shardopt_hyperparams h = poisoned();
  REQUIRE(shardopt_optimizer_get_hyperparams(opt, group, &h) == SHARDOPT_OK);
  return h;
}

shardopt_hyperparams defaults_of(shardopt_optimizer_t opt) {
  shardopt_hyperparams h = poisoned();
  REQUIRE(shardopt_optimizer_get_defaults(opt, &h) == SHARDOPT_OK);
  return h;
}

bool same(const shardopt_hyperparams& a, const shardopt_hyperparams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
         a.nesterov == b.nesterov && a.maximize == b.maximize && a.amsgrad == b.amsgrad;
}

shardopt_optimizer_t create(const CommHandle& comm, const shardopt_optimizer_config& config,
                            const shardopt_param_group_desc& group) {
  shardopt_optimizer_t opt = nullptr;
  const shardopt_status status = shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  return opt;
}

// shardopt_optimizer_config as the second header declared it, before `defaults`.
struct config_before_defaults {
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
};

}  // namespace

TEST_CASE("shardopt_default_hyperparams gives torch's constructor defaults per algorithm", "[capi][defaults]") {
  shardopt_hyperparams adam_init;
  shardopt_hyperparams_init(&adam_init);
  shardopt_hyperparams h;
  shardopt_hyperparams_init(&h);
  REQUIRE(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_ADAM, &h) == SHARDOPT_OK);
  CHECK(same(h, adam_init));
  REQUIRE(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_SGD, &h) == SHARDOPT_OK);
  CHECK(same(h, adam_init));
  REQUIRE(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_ADAMW, &h) == SHARDOPT_OK);
  CHECK(h.weight_decay == 0.01);
  CHECK(h.lr == 1e-3);
  CHECK(h.beta1 == 0.9);
  CHECK(h.beta2 == 0.999);
  CHECK(h.eps == 1e-8);
  CHECK(h.amsgrad == 0);

  CHECK(shardopt_default_hyperparams(static_cast<shardopt_algorithm>(7), &h) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_default_hyperparams: algorithm is 7, not a shardopt_algorithm (0..3)");
  CHECK(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_ADAM, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  h.struct_size = 3;
  CHECK(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_ADAM, &h) == SHARDOPT_ERR_STRUCT_SIZE);
}

TEST_CASE("an AdamW group with NULL hyperparams takes torch's AdamW defaults (weight_decay 0.01)",
          "[capi][defaults]") {
  CommHandle comm;
  OneParam w("w", 11);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  REQUIRE(config.defaults == nullptr);
  shardopt_optimizer_t opt = create(comm, config, w.group());

  const shardopt_hyperparams group = hyperparams_of(opt, 0);
  CHECK(group.weight_decay == 0.01);
  CHECK(group.lr == 1e-3);
  CHECK(group.amsgrad == 0);
  shardopt_hyperparams expected;
  shardopt_hyperparams_init(&expected);
  REQUIRE(shardopt_default_hyperparams(SHARDOPT_ALGORITHM_ADAMW, &expected) == SHARDOPT_OK);
  CHECK(same(defaults_of(opt), expected));

  // A group added later with NULL hyperparams takes them too; one with its own keeps its own.
  OneParam b("b", 3);
  int32_t index = -1;
  shardopt_param_group_desc later = b.group();
  REQUIRE(shardopt_optimizer_add_param_group(opt, &later, &index) == SHARDOPT_OK);
  CHECK(index == 1);
  CHECK(hyperparams_of(opt, 1).weight_decay == 0.01);
  OneParam c("c", 2);
  shardopt_hyperparams own;
  shardopt_hyperparams_init(&own);  // Adam's: weight_decay 0, set explicitly by this group
  own.lr = 0.25;
  later = c.group(&own);
  REQUIRE(shardopt_optimizer_add_param_group(opt, &later, &index) == SHARDOPT_OK);
  CHECK(same(hyperparams_of(opt, 2), own));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // Adam's own defaults stay torch's (weight_decay 0).
  config.algorithm = SHARDOPT_ALGORITHM_ADAM;
  opt = create(comm, config, w.group());
  CHECK(hyperparams_of(opt, 0).weight_decay == 0.0);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("config->defaults are inherited by groups with NULL hyperparams, at create and added later",
          "[capi][defaults]") {
  CommHandle comm;
  OneParam w("w", 9);
  OneParam b("b", 4);
  // On the heap, freed before the later add_param_group: create copies it and keeps no pointer.
  auto defaults = std::make_unique<shardopt_hyperparams>();
  shardopt_hyperparams_init(defaults.get());
  defaults->amsgrad = 1;
  defaults->lr = 0.05;
  defaults->beta2 = 0.98;
  shardopt_hyperparams given = *defaults;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.defaults = defaults.get();
  shardopt_optimizer_t opt = create(comm, config, w.group());
  defaults.reset();

  CHECK(same(defaults_of(opt), given));
  CHECK(same(hyperparams_of(opt, 0), given));  // whole: weight_decay 0 from the struct, not AdamW's 0.01
  shardopt_param_group_desc later = b.group();
  int32_t index = -1;
  REQUIRE(shardopt_optimizer_add_param_group(opt, &later, &index) == SHARDOPT_OK);
  const shardopt_hyperparams added = hyperparams_of(opt, index);
  CHECK(added.amsgrad == 1);
  CHECK(added.lr == 0.05);
  CHECK(added.beta2 == 0.98);

  // Changing a group later does not change the defaults later groups take.
  shardopt_hyperparams changed = hyperparams_of(opt, 0);
  changed.lr = 0.5;
  REQUIRE(shardopt_optimizer_set_hyperparams(opt, 0, &changed) == SHARDOPT_OK);
  CHECK(defaults_of(opt).lr == 0.05);

  // Both groups step with AMSGrad: one more state tensor per element than plain Adam.
  for (int32_t id = 0; id < 2; ++id) {
    shardopt_tensor grad{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &grad) == SHARDOPT_OK);
    std::fill_n(static_cast<float*>(grad.data), grad.numel, 0.25f);
  }
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  CHECK(report.state_bytes == 3 * 4 * report.shard_numel);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("bad config->defaults fail the create on every rank, naming the field", "[capi][defaults][errors]") {
  CommHandle comm;
  OneParam w("w", 5);
  shardopt_hyperparams defaults;
  shardopt_hyperparams_init(&defaults);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.defaults = &defaults;
  shardopt_optimizer_t opt = nullptr;
  const shardopt_param_group_desc group = w.group();

  // Wrong on the last rank only: every rank fails together instead of waiting.
  // (Read before the failing call: a successful call clears the last error.)
  const std::string last_rank = std::to_string(comm.size() - 1);
  const bool culprit = comm.rank() == comm.size() - 1;
  if (culprit) defaults.lr = -1.0;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  INFO(last_error());
  if (culprit) {
    CHECK(contains(last_error(), "shardopt_optimizer_create: config->defaults: invalid lr -1"));
  } else {
    CHECK(contains(last_error(), "ZeroOptimizer failed on rank " + last_rank));
    CHECK(contains(last_error(), "config->defaults: invalid lr -1"));
  }
  CHECK(opt == nullptr);

  defaults.lr = 1e-3;
  defaults.struct_size = 8;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "config->defaults->struct_size is 8"));
  CHECK(opt == nullptr);
}

TEST_CASE("a config of the header before `defaults` is accepted and takes torch's defaults", "[capi][defaults][versions]") {
  CommHandle comm;
  OneParam w("w", 6);
  // Exactly its size on the heap, so reading `defaults` past it would be an ASan error.
  shardopt_optimizer_config current;
  shardopt_optimizer_config_init(&current);
  current.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  auto old = std::make_unique<config_before_defaults>();
  std::memcpy(old.get(), &current, sizeof(config_before_defaults));
  old->struct_size = sizeof(config_before_defaults);
  REQUIRE(sizeof(config_before_defaults) < sizeof(shardopt_optimizer_config));
  const shardopt_param_group_desc group = w.group();
  shardopt_optimizer_t opt = nullptr;
  const shardopt_status status = shardopt_optimizer_create(
      comm.get(), reinterpret_cast<const shardopt_optimizer_config*>(old.get()), &group, 1, &opt);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  CHECK(hyperparams_of(opt, 0).weight_decay == 0.01);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
