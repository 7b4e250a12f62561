// tests/capi/capi_averaging_support.hpp — one local SGD run through the C++ API or the C ABI, and what it leaves behind, for the C ABI averaging tests.
#pragma once

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

namespace shardopt_capi_averaging_test {

using shardopt_capi_test::last_error;

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<int64_t> kSizes = {37, 5, 200, 1};
constexpr double kLr = 0.01;

// This rank's gradient of param `id` at `step`: different on every rank, so that the replicas
// drift apart between averagings and the averaging changes something.
inline std::vector<float> rank_grad(int32_t id, int step, int rank, int64_t numel) {
  return shardopt_test::seeded_values(1000u + static_cast<uint32_t>(id) * 97u + static_cast<uint32_t>(step) * 13u +
                                          static_cast<uint32_t>(rank) * 7919u,
                                      numel);
}

// ---- one run, through the C++ API or the C ABI ---------------------------------------------------

// What a run leaves behind, compared between the two APIs.
struct Outcome {
  std::vector<float> params;
  int64_t averager_step = -1;
  int next_group_size = -1;
  shardopt::CommunicationCounts counts;
};

inline bool same(const Outcome& a, const Outcome& b) {
  return shardopt_test::bitwise_equal(a.params, b.params) && a.averager_step == b.averager_step &&
         a.next_group_size == b.next_group_size && a.counts.gradient_bytes == b.counts.gradient_bytes &&
         a.counts.averaging_bytes == b.counts.averaging_bytes && a.counts.averages == b.counts.averages;
}

// The averaging as both APIs take it: levels, warmup, hierarchical, the outer optimizer.
struct Setting {
  std::vector<shardopt::AveragingLevel> levels;
  int64_t warmup_steps = 0;
  bool hierarchical = false;
  bool outer = false;

  shardopt::AveragerConfig cpp() const {
    shardopt::AveragerConfig c;
    c.levels = levels;
    c.warmup_steps = warmup_steps;
    c.hierarchical = hierarchical;
    c.outer.enabled = outer;
    c.outer.lr = 0.5;
    c.outer.momentum = 0.8;
    return c;
  }

  // `storage` holds the levels the returned struct points at.
  shardopt_averager_config c(std::vector<shardopt_averaging_level>& storage) const {
    storage.clear();
    for (const shardopt::AveragingLevel& l : levels) storage.push_back({l.period, l.group_size});
    shardopt_averager_config c;
    shardopt_averager_config_init(&c);
    c.levels = storage.data();
    c.num_levels = storage.size();
    c.warmup_steps = warmup_steps;
    c.hierarchical = hierarchical ? 1 : 0;
    c.outer.enabled = outer ? 1 : 0;
    c.outer.lr = 0.5;
    c.outer.momentum = 0.8;
    return c;
  }
};

// The settings every world size can run: each rank is a replica of its own (plain local SGD).
inline std::vector<std::pair<std::string, Setting>> settings(int world_size) {
  std::vector<std::pair<std::string, Setting>> out;
  out.push_back({"periodic, warmup 3, period 2", Setting{{{2, 0}}, 3, false, false}});
  out.push_back({"periodic with an outer optimizer", Setting{{{3, 0}}, 1, false, true}});
  if (world_size > 1) {
    out.push_back({"hierarchical", Setting{{{2, 1}, {3, world_size}}, 2, true, false}});
  }
  return out;
}

// Through the C++ API: a replica of one rank, PostLocalSGDOptimizer or a ModelAverager.
inline Outcome run_cpp(const Setting& setting, int steps, bool post_local_sgd) {
  std::shared_ptr<shardopt::Communicator> world = shardopt_test::world();
  const int rank = world->rank();
  std::shared_ptr<shardopt::Communicator> replica = world->split(rank, 0);
  shardopt_test::SeededParams params(kSizes, 31);
  shardopt::GroupHyperparams hyper;
  hyper.lr = kLr;
  shardopt::ZeroOptimizer opt(replica, shardopt::OptimizerConfig{}, {params.all(hyper)});
  Outcome out;
  auto write_grads = [&](int step) {
    for (int32_t id = 0; id < opt.num_params(); ++id) {
      const shardopt::TensorRef g = opt.grad_view(id);
      const std::vector<float> values = rank_grad(id, step, rank, g.numel);
      std::memcpy(g.data, values.data(), g.nbytes());
    }
  };
  if (post_local_sgd) {
    shardopt::PostLocalSGDOptimizer plsgd(world, opt, setting.cpp());
    for (int step = 0; step < steps; ++step) {
      write_grads(step);
      plsgd.reduce_gradients();
      plsgd.step();
    }
    out.averager_step = plsgd.averager().step();
    out.next_group_size = plsgd.averager().next_group_size();
    out.counts = plsgd.communication();
  } else {
    shardopt::ModelAverager averager(world, opt, setting.cpp());
    for (int step = 0; step < steps; ++step) {
      write_grads(step);
      opt.reduce_gradients();
      opt.step();
      averager.average_parameters();
    }
    out.averager_step = averager.step();
    out.next_group_size = averager.next_group_size();
    out.counts = averager.communication();
  }
  out.params = shardopt_test::all_params(opt);
  return out;
}

// A world handle with a short timeout (a failed check on one rank must not hang the others
// for long), and a replica of one rank split from it, destroyed at the end.
struct Comms {
  shardopt_comm_t world = nullptr;
  shardopt_comm_t replica = nullptr;
  int rank = -1;
  int size = 0;

  Comms() {
    shardopt_comm_options options;
    shardopt_comm_options_init(&options);
    options.timeout_seconds = 120;
    REQUIRE(shardopt_comm_world(&options, &world) == SHARDOPT_OK);
    REQUIRE(shardopt_comm_rank(world, &rank) == SHARDOPT_OK);
    REQUIRE(shardopt_comm_size(world, &size) == SHARDOPT_OK);
    REQUIRE(shardopt_comm_split(world, rank, 0, &replica) == SHARDOPT_OK);
  }
  ~Comms() {
    shardopt_comm_destroy(replica);
    shardopt_comm_destroy(world);
  }
  Comms(const Comms&) = delete;
  Comms& operator=(const Comms&) = delete;
};

// The C++ run's parameters, registered through the C ABI (bucket view, Adam, lr kLr).
struct CModel {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<shardopt_param_desc> descs;
  shardopt_hyperparams hyper;

  CModel() {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(shardopt_test::seeded_values(31u + static_cast<uint32_t>(i), kSizes[i]));
    }
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param.data = values[i].data();
      d.param.numel = kSizes[i];
      descs.push_back(d);
    }
    shardopt_hyperparams_init(&hyper);
    hyper.lr = kLr;
  }

  shardopt_optimizer_t create(shardopt_comm_t comm) const {
    shardopt_param_group_desc group;
    shardopt_param_group_desc_init(&group);
    group.params = descs.data();
    group.num_params = descs.size();
    group.hyperparams = &hyper;
    shardopt_optimizer_config config;
    shardopt_optimizer_config_init(&config);
    shardopt_optimizer_t opt = nullptr;
    const shardopt_status status = shardopt_optimizer_create(comm, &config, &group, 1, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
    return opt;
  }
};

inline void write_grads_c(shardopt_optimizer_t opt, int step, int rank) {
  int32_t n = 0;
  REQUIRE(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_OK);
  for (int32_t id = 0; id < n; ++id) {
    shardopt_tensor g{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
    const std::vector<float> values = rank_grad(id, step, rank, g.numel);
    std::memcpy(g.data, values.data(), values.size() * sizeof(float));
  }
}

inline std::vector<float> params_c(shardopt_optimizer_t opt) {
  int32_t n = 0;
  REQUIRE(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_OK);
  std::vector<float> out;
  for (int32_t id = 0; id < n; ++id) {
    shardopt_tensor v{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
    const float* data = static_cast<const float*>(v.data);
    out.insert(out.end(), data, data + v.numel);
  }
  return out;
}

inline shardopt::CommunicationCounts counts_of(const shardopt_communication_counts& c) {
  shardopt::CommunicationCounts out;
  out.gradient_bytes = c.gradient_bytes;
  out.averaging_bytes = c.averaging_bytes;
  out.averages = c.averages;
  return out;
}

// Checks a C call, showing the library's message when it fails.
#define CAPI_OK(call)                  \
  do {                                 \
    const shardopt_status s_ = (call); \
    INFO(last_error());                \
    REQUIRE(s_ == SHARDOPT_OK);        \
  } while (false)

inline shardopt_post_local_sgd_t create_plsgd(const Comms& comms, shardopt_optimizer_t opt, const Setting& setting) {
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = setting.c(levels);
  shardopt_post_local_sgd_t plsgd = nullptr;
  CAPI_OK(shardopt_post_local_sgd_create(comms.world, opt, &config, &plsgd));
  REQUIRE(plsgd != nullptr);
  return plsgd;
}

inline void train_c(shardopt_post_local_sgd_t plsgd, shardopt_optimizer_t opt, int first, int last, int rank) {
  for (int step = first; step < last; ++step) {
    write_grads_c(opt, step, rank);
    CAPI_OK(shardopt_post_local_sgd_reduce_gradients(plsgd));
    CAPI_OK(shardopt_post_local_sgd_step(plsgd));
  }
}

// Through the C ABI, the same run as run_cpp.
inline Outcome run_c(const Setting& setting, int steps, bool post_local_sgd) {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  Outcome out;
  shardopt_communication_counts counts;
  shardopt_communication_counts_init(&counts);
  int32_t next = -1;
  if (post_local_sgd) {
    shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, setting);
    train_c(plsgd, opt, 0, steps, comms.rank);
    CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &out.averager_step));
    CAPI_OK(shardopt_post_local_sgd_next_group_size(plsgd, &next));
    CAPI_OK(shardopt_post_local_sgd_communication(plsgd, &counts));
    CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  } else {
    std::vector<shardopt_averaging_level> levels;
    const shardopt_averager_config config = setting.c(levels);
    shardopt_model_averager_t averager = nullptr;
    CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
    int32_t replica_size = 0;
    int32_t num_replicas = 0;
    CAPI_OK(shardopt_model_averager_replicas(averager, &replica_size, &num_replicas));
    CHECK(replica_size == 1);
    CHECK(num_replicas == comms.size);
    for (int step = 0; step < steps; ++step) {
      write_grads_c(opt, step, comms.rank);
      CAPI_OK(shardopt_optimizer_reduce_gradients(opt));
      CAPI_OK(shardopt_optimizer_step(opt));
      CAPI_OK(shardopt_model_averager_average_parameters(averager));
    }
    CAPI_OK(shardopt_model_averager_step(averager, &out.averager_step));
    CAPI_OK(shardopt_model_averager_next_group_size(averager, &next));
    CAPI_OK(shardopt_model_averager_communication(averager, &counts));
    CAPI_OK(shardopt_model_averager_destroy(averager));
  }
  out.next_group_size = next;
  out.counts = counts_of(counts);
  out.params = params_c(opt);
  CAPI_OK(shardopt_optimizer_destroy(opt));
  return out;
}

}  // namespace shardopt_capi_averaging_test
