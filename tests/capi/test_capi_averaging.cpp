// tests/capi/test_capi_averaging.cpp — model averaging through the C ABI: local SGD runs bitwise equal to the C++ API's, config errors on every rank, NULL/wrong/destroyed handles, the optimizer outliving its handle, and save/load round trips.
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

using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<int64_t> kSizes = {37, 5, 200, 1};
constexpr double kLr = 0.01;

// This rank's gradient of param `id` at `step`: different on every rank, so that the replicas
// drift apart between averagings and the averaging changes something.
std::vector<float> rank_grad(int32_t id, int step, int rank, int64_t numel) {
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

bool same(const Outcome& a, const Outcome& b) {
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
std::vector<std::pair<std::string, Setting>> settings(int world_size) {
  std::vector<std::pair<std::string, Setting>> out;
  out.push_back({"periodic, warmup 3, period 2", Setting{{{2, 0}}, 3, false, false}});
  out.push_back({"periodic with an outer optimizer", Setting{{{3, 0}}, 1, false, true}});
  if (world_size > 1) {
    out.push_back({"hierarchical", Setting{{{2, 1}, {3, world_size}}, 2, true, false}});
  }
  return out;
}

// Through the C++ API: a replica of one rank, PostLocalSGDOptimizer or a ModelAverager.
Outcome run_cpp(const Setting& setting, int steps, bool post_local_sgd) {
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

void write_grads_c(shardopt_optimizer_t opt, int step, int rank) {
  int32_t n = 0;
  REQUIRE(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_OK);
  for (int32_t id = 0; id < n; ++id) {
    shardopt_tensor g{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
    const std::vector<float> values = rank_grad(id, step, rank, g.numel);
    std::memcpy(g.data, values.data(), values.size() * sizeof(float));
  }
}

std::vector<float> params_c(shardopt_optimizer_t opt) {
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

shardopt::CommunicationCounts counts_of(const shardopt_communication_counts& c) {
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

shardopt_post_local_sgd_t create_plsgd(const Comms& comms, shardopt_optimizer_t opt, const Setting& setting) {
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = setting.c(levels);
  shardopt_post_local_sgd_t plsgd = nullptr;
  CAPI_OK(shardopt_post_local_sgd_create(comms.world, opt, &config, &plsgd));
  REQUIRE(plsgd != nullptr);
  return plsgd;
}

void train_c(shardopt_post_local_sgd_t plsgd, shardopt_optimizer_t opt, int first, int last, int rank) {
  for (int step = first; step < last; ++step) {
    write_grads_c(opt, step, rank);
    CAPI_OK(shardopt_post_local_sgd_reduce_gradients(plsgd));
    CAPI_OK(shardopt_post_local_sgd_step(plsgd));
  }
}

// Through the C ABI, the same run as run_cpp.
Outcome run_c(const Setting& setting, int steps, bool post_local_sgd) {
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

}  // namespace

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

// ---- errors -------------------------------------------------------------------------------------------

TEST_CASE("bad averager configs fail the create on every rank, through the C ABI", "[capi][averaging][errors]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);

  std::vector<shardopt_averaging_level> levels;
  shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);
  shardopt_status expected = SHARDOPT_ERR_INVALID_ARGUMENT;
  std::string message;
  SECTION("a period of 0") {
    levels[0].period = 0;
    message = "period";
  }
  SECTION("no levels") {
    config.num_levels = 0;
  }
  SECTION("a negative warmup") {
    config.warmup_steps = -1;
    message = "warmup_steps";
  }
  SECTION("a group size that does not divide the world") {
    levels[0].group_size = comms.size + 1;
  }
  SECTION("levels NULL with a count") {
    config.levels = nullptr;
    expected = SHARDOPT_ERR_NULL_POINTER;
    message = "config->levels is NULL but config->num_levels is 1";
  }
  SECTION("a struct size no version has") {
    config.struct_size = sizeof(shardopt_averager_config) + 8;
    expected = SHARDOPT_ERR_STRUCT_SIZE;
    message = "config->struct_size";
  }

  for (const bool post_local_sgd : {true, false}) {
    INFO((post_local_sgd ? "shardopt_post_local_sgd_create" : "shardopt_model_averager_create"));
    shardopt_status status = SHARDOPT_OK;
    const std::string function = post_local_sgd ? "shardopt_post_local_sgd_create" : "shardopt_model_averager_create";
    if (post_local_sgd) {
      shardopt_post_local_sgd_t out = reinterpret_cast<shardopt_post_local_sgd_t>(&comms);
      status = shardopt_post_local_sgd_create(comms.world, opt, &config, &out);
      CHECK(out == nullptr);
    } else {
      shardopt_model_averager_t out = reinterpret_cast<shardopt_model_averager_t>(&comms);
      status = shardopt_model_averager_create(comms.world, opt, &config, &out);
      CHECK(out == nullptr);
    }
    INFO(last_error());
    CHECK(status == expected);
    CHECK(contains(last_error(), function + ": "));
    CHECK(contains(last_error(), message));
  }
  // The world is still usable: every rank failed in the same call.
  CAPI_OK(shardopt_comm_barrier(comms.world));
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

TEST_CASE("a create refused on one rank fails on every rank", "[capi][averaging][errors]") {
  Comms comms;
  if (comms.size < 2) return;
  // Replicas of one rank, and one replica of every rank: the refusing rank never reaches a
  // collective of its replica, so the constructor must not start with one.
  for (shardopt_comm_t replica : {comms.replica, comms.world}) {
    CModel model;
    shardopt_optimizer_t opt = model.create(replica);
    std::vector<shardopt_averaging_level> levels;
    shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);
    if (comms.rank == 1) config.struct_size = 3;
    shardopt_post_local_sgd_t out = nullptr;
    const shardopt_status status = shardopt_post_local_sgd_create(comms.world, opt, &config, &out);
    INFO(last_error());
    CHECK(out == nullptr);
    if (comms.rank == 1) {
      CHECK(status == SHARDOPT_ERR_STRUCT_SIZE);
    } else {
      CHECK(status != SHARDOPT_OK);
      CHECK(contains(last_error(), "rank 1"));
    }
    CAPI_OK(shardopt_comm_barrier(comms.world));
    CAPI_OK(shardopt_optimizer_destroy(opt));
  }
}

TEST_CASE("every averaging function refuses NULL handles by name", "[capi][averaging][errors]") {
  const shardopt_model_averager_t averager = nullptr;
  const shardopt_post_local_sgd_t plsgd = nullptr;
  int64_t i64 = 0;
  int32_t i32 = 0;
  int32_t j32 = 0;
  shardopt_tensor tensor{};
  shardopt_communication_counts counts;
  shardopt_communication_counts_init(&counts);
  const std::string null_averager =
      "averager is NULL; shardopt_model_averager_create leaves its output NULL when it fails";
  const std::string null_plsgd = "plsgd is NULL; shardopt_post_local_sgd_create leaves its output NULL when it fails";

  const std::vector<std::pair<const char*, std::function<shardopt_status()>>> averager_calls = {
      {"shardopt_model_averager_average_parameters", [&] { return shardopt_model_averager_average_parameters(averager); }},
      {"shardopt_model_averager_step", [&] { return shardopt_model_averager_step(averager, &i64); }},
      {"shardopt_model_averager_set_step", [&] { return shardopt_model_averager_set_step(averager, 1); }},
      {"shardopt_model_averager_next_group_size", [&] { return shardopt_model_averager_next_group_size(averager, &i32); }},
      {"shardopt_model_averager_replicas", [&] { return shardopt_model_averager_replicas(averager, &i32, &j32); }},
      {"shardopt_model_averager_communication", [&] { return shardopt_model_averager_communication(averager, &counts); }},
  };
  for (const auto& [function, call] : averager_calls) {
    INFO(function);
    CHECK(call() == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == std::string(function) + ": " + null_averager);
  }
  const std::vector<std::pair<const char*, std::function<shardopt_status()>>> plsgd_calls = {
      {"shardopt_post_local_sgd_reduce_gradients", [&] { return shardopt_post_local_sgd_reduce_gradients(plsgd); }},
      {"shardopt_post_local_sgd_reduce_gradient", [&] { return shardopt_post_local_sgd_reduce_gradient(plsgd, 0, &tensor); }},
      {"shardopt_post_local_sgd_reduce_gradient_dlpack",
       [&] { return shardopt_post_local_sgd_reduce_gradient_dlpack(plsgd, 0, nullptr); }},
      {"shardopt_post_local_sgd_step", [&] { return shardopt_post_local_sgd_step(plsgd); }},
      {"shardopt_post_local_sgd_save", [&] { return shardopt_post_local_sgd_save(plsgd, "unused"); }},
      {"shardopt_post_local_sgd_load", [&] { return shardopt_post_local_sgd_load(plsgd, "unused"); }},
      {"shardopt_post_local_sgd_averager_step", [&] { return shardopt_post_local_sgd_averager_step(plsgd, &i64); }},
      {"shardopt_post_local_sgd_set_averager_step", [&] { return shardopt_post_local_sgd_set_averager_step(plsgd, 1); }},
      {"shardopt_post_local_sgd_next_group_size", [&] { return shardopt_post_local_sgd_next_group_size(plsgd, &i32); }},
      {"shardopt_post_local_sgd_communication", [&] { return shardopt_post_local_sgd_communication(plsgd, &counts); }},
      {"shardopt_post_local_sgd_consolidate_state_dict",
       [&] { return shardopt_post_local_sgd_consolidate_state_dict(plsgd, 0); }},
      {"shardopt_post_local_sgd_state_dict_step",
       [&] { return shardopt_post_local_sgd_state_dict_step(plsgd, &i32, &i64); }},
  };
  for (const auto& [function, call] : plsgd_calls) {
    INFO(function);
    CHECK(call() == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == std::string(function) + ": " + null_plsgd);
  }
  // Destroying NULL is a no-op, as free(NULL).
  CHECK(shardopt_model_averager_destroy(nullptr) == SHARDOPT_OK);
  CHECK(shardopt_post_local_sgd_destroy(nullptr) == SHARDOPT_OK);

  // The creates: a NULL world fails alone (no communicator to tell the others through).
  shardopt_averager_config config;
  shardopt_averager_config_init(&config);
  shardopt_post_local_sgd_t out = nullptr;
  CHECK(shardopt_post_local_sgd_create(nullptr, nullptr, &config, &out) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_post_local_sgd_create: world is NULL"));
  shardopt_model_averager_t out_averager = nullptr;
  CHECK(shardopt_model_averager_create(nullptr, nullptr, &config, &out_averager) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_model_averager_create: world is NULL"));
}

TEST_CASE("NULL optimizers and configs, wrong kinds and destroyed handles are refused", "[capi][averaging][errors]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = Setting{{{2, 0}}, 0, false, false}.c(levels);

  // Collective refusals: every rank passes the same wrong argument.
  shardopt_post_local_sgd_t plsgd = nullptr;
  CHECK(shardopt_post_local_sgd_create(comms.world, nullptr, &config, &plsgd) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "opt is NULL"));
  CHECK(shardopt_post_local_sgd_create(comms.world, opt, nullptr, &plsgd) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "config is NULL"));
  CHECK(shardopt_post_local_sgd_create(comms.world, opt, &config, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "out is NULL"));
  // A communicator where an optimizer belongs.
  CHECK(shardopt_model_averager_create(comms.world, reinterpret_cast<shardopt_optimizer_t>(comms.replica), &config,
                                       nullptr) == SHARDOPT_ERR_NULL_POINTER);
  shardopt_model_averager_t averager = nullptr;
  CHECK(shardopt_model_averager_create(comms.world, reinterpret_cast<shardopt_optimizer_t>(comms.replica), &config,
                                       &averager) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "opt is a shardopt_comm_t, not a shardopt_optimizer_t"));
  CHECK(averager == nullptr);

  CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
  plsgd = create_plsgd(comms, opt, Setting{{{2, 0}}, 0, false, false});
  // Each kind where the other belongs.
  int64_t step = 0;
  CHECK(shardopt_post_local_sgd_averager_step(reinterpret_cast<shardopt_post_local_sgd_t>(averager), &step) ==
        SHARDOPT_ERR_BAD_HANDLE);
  CHECK(last_error() ==
        "shardopt_post_local_sgd_averager_step: plsgd is a shardopt_model_averager_t, not a shardopt_post_local_sgd_t");
  CHECK(shardopt_model_averager_step(reinterpret_cast<shardopt_model_averager_t>(plsgd), &step) ==
        SHARDOPT_ERR_BAD_HANDLE);
  CHECK(last_error() ==
        "shardopt_model_averager_step: averager is a shardopt_post_local_sgd_t, not a shardopt_model_averager_t");
  CHECK(shardopt_optimizer_step(reinterpret_cast<shardopt_optimizer_t>(plsgd)) == SHARDOPT_ERR_BAD_HANDLE);
  // A struct size the counts struct never had.
  shardopt_communication_counts counts;
  shardopt_communication_counts_init(&counts);
  counts.struct_size = 4;
  CHECK(shardopt_post_local_sgd_communication(plsgd, &counts) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(shardopt_model_averager_communication(averager, &counts) == SHARDOPT_ERR_STRUCT_SIZE);

  CAPI_OK(shardopt_model_averager_destroy(averager));
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  // Destroyed: refused without being dereferenced.
  CHECK(shardopt_model_averager_step(averager, &step) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "was destroyed, or never created"));
  CHECK(shardopt_post_local_sgd_step(plsgd) == SHARDOPT_ERR_BAD_HANDLE);
  CAPI_OK(shardopt_optimizer_destroy(opt));
}

TEST_CASE("an averager keeps its optimizer alive past shardopt_optimizer_destroy", "[capi][averaging]") {
  Comms comms;
  CModel model;
  shardopt_optimizer_t opt = model.create(comms.replica);
  const Setting setting{{{2, 0}}, 0, false, false};
  shardopt_post_local_sgd_t plsgd = create_plsgd(comms, opt, setting);
  std::vector<shardopt_averaging_level> levels;
  const shardopt_averager_config config = setting.c(levels);
  shardopt_model_averager_t averager = nullptr;
  CAPI_OK(shardopt_model_averager_create(comms.world, opt, &config, &averager));
  train_c(plsgd, opt, 0, 2, comms.rank);

  CAPI_OK(shardopt_optimizer_destroy(opt));
  // The handle is gone...
  int32_t n = 0;
  CHECK(shardopt_optimizer_num_params(opt, &n) == SHARDOPT_ERR_BAD_HANDLE);
  // ...the optimizer is not: both averagers still step it.
  CAPI_OK(shardopt_post_local_sgd_reduce_gradients(plsgd));
  CAPI_OK(shardopt_post_local_sgd_step(plsgd));
  CAPI_OK(shardopt_model_averager_average_parameters(averager));
  int64_t step = 0;
  CAPI_OK(shardopt_post_local_sgd_averager_step(plsgd, &step));
  CHECK(step == 3);
  CAPI_OK(shardopt_post_local_sgd_destroy(plsgd));
  CAPI_OK(shardopt_model_averager_destroy(averager));  // the last user: frees the optimizer
}
