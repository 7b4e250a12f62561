// tests/mpi/test_agreement.cpp — every collective call starts with an agreement: ranks in different calls, with different arguments or with an invalid value on one rank fail together, fast, by name.
//
// Each test makes its own world communicator with a 10 s watchdog, so a regression (a rank left
// waiting in a collective its peers never join) fails in seconds instead of hanging the job,
// and checks that its error came in well under that. Every rank runs the same body and checks
// its own error; per-rank branches make the ranks disagree. Checks are CHECKs, not REQUIREs,
// so that a failed check does not take one rank out of the lockstep the others rely on.
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

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;

namespace {

// A collective that has not finished after this long is a hang: the error must come before.
constexpr double kWatchdogSeconds = 10.0;
constexpr double kFastSeconds = 8.0;

std::shared_ptr<Communicator> test_comm() { return mpi_world(CommOptions{kWatchdogSeconds}); }

// What a call threw (if anything) and how long it took.
struct Outcome {
  bool threw = false;
  ErrorCode code = ErrorCode::internal;
  std::string what;
  double seconds = 0.0;
};

template <typename Call>
Outcome outcome_of(Call&& call) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
  } catch (const Error& e) {
    o.threw = true;
    o.code = e.code();
    o.what = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

// The call failed with `code`, in time, and its message holds every one of `parts`.
void check_error(const Outcome& o, ErrorCode code, const std::vector<std::string>& parts) {
  INFO("message: " << o.what);
  CHECK(o.threw);
  CHECK(error_code_name(o.code) == std::string(error_code_name(code)));
  CHECK(o.seconds < kFastSeconds);
  for (const std::string& part : parts) CHECK_THAT(o.what, Catch::Contains(part));
}

// "ranks are in different calls" naming rank 0's call and the last rank's call.
void check_different_calls(const Outcome& o, const std::string& first_call, int last, const std::string& last_call) {
  check_error(o, ErrorCode::mismatch,
              {"ranks are in different calls", "rank 0 is in " + first_call,
               "rank " + std::to_string(last) + " is in " + last_call});
}

// "ranks disagree on {field}: rank 0 has {v0}, rank {last} has {v1}".
void check_disagree(const Outcome& o, const std::string& field, const std::string& v0, int last, const std::string& v1) {
  check_error(o, ErrorCode::mismatch,
              {"ranks disagree on " + field, "rank 0 has " + v0, "rank " + std::to_string(last) + " has " + v1});
}

// An invalid value on rank `bad`: the same code everywhere, its own text on every rank, and the
// culprit named on the others.
void check_invalid_on(const Outcome& o, int me, int bad, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  if (me != bad) all.push_back("on rank " + std::to_string(bad));
  check_error(o, ErrorCode::invalid_argument, all);
}

std::string num(double v) { return fmt::format("{}", v); }

using Params = shardopt_test::SeededParams;

const std::vector<std::pair<std::string, int64_t>> kSmall = {{"embed", 24}, {"fc.weight", 40}, {"fc.bias", 8}};

// The same gradients on every rank, so no reduction is needed for the ranks to agree.
void write_grads(ZeroOptimizer& opt, int step) {
  shardopt_test::write_seeded_grads(opt, 500u + static_cast<uint32_t>(step * 31));
}

// A state dict with no per-parameter state: what consolidate_state_dict gives before any step.
StateDict stateless_dict(const ZeroOptimizer& opt) {
  StateDict sd;
  sd.algorithm = opt.config().algorithm;
  for (ParamId id = 0; id < opt.num_params(); ++id) sd.param_names.push_back(opt.param_name(id));
  for (int g = 0; g < opt.num_groups(); ++g) {
    ParamGroupState group;
    group.hyper = opt.hyperparams(g);
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      if (opt.param_group(id) == g) group.params.push_back(id);
    }
    sd.param_groups.push_back(group);
  }
  return sd;
}

// A scratch directory shared by the ranks of this run (rank 0's pid names it).
std::filesystem::path shared_scratch(Communicator& comm, const std::string& what) {
  uint32_t pid = static_cast<uint32_t>(::getpid());
  comm.broadcast(&pid, 2, DType::bf16, 0);  // two raw 16-bit words
  return std::filesystem::temp_directory_path() /
         fmt::format("shardopt-{}-{}-np{}", what, pid, comm.size());
}

}  // namespace

// ---- ranks in different calls ----------------------------------------------------------------

TEST_CASE("ranks in different collective calls fail together and the error names both calls", "[agreement]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Params params(kSmall);
  OptimizerConfig config;
  auto make = [&] { return std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{params.all()}); };

  // A checkpoint for load() to find, so that every call below would succeed on its own.
  const auto dir = shared_scratch(*comm, "agreement");
  {
    auto opt = make();
    opt->save(dir.string());
  }

  struct Call {
    std::string name;
    std::function<void(std::unique_ptr<ZeroOptimizer>&)> run;
  };
  std::vector<float> extra(4, 0.5f);
  const std::vector<Call> calls = {
      {"ZeroOptimizer()", [&](std::unique_ptr<ZeroOptimizer>&) { make(); }},
      {"add_param_group()",
       [&](std::unique_ptr<ZeroOptimizer>& opt) {
         ParamGroupSpec g;
         g.params.push_back(ParamSpec{"extra", TensorRef{extra.data(), 4}, TensorRef{}});
         opt->add_param_group(g);
       }},
      {"set_trainable()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->set_trainable(1, false); }},
      {"reduce_gradients()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->reduce_gradients(); }},
      {"clip_grad_norm()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->clip_grad_norm(1.0); }},
      {"step()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->step(); }},
      {"save()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->save(dir.string()); }},
      {"load()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->load(dir.string()); }},
      {"consolidate_state_dict()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->consolidate_state_dict(0); }},
      {"load_state_dict()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->load_state_dict(stateless_dict(*opt)); }},
      // The closure form is step() too.
      {"step()", [&](std::unique_ptr<ZeroOptimizer>& opt) { opt->step([] { return 1.0; }); }},
  };

  // Each call on the last rank against the next one on all the others (and the closure form of
  // step() against the first), so every call appears on both sides.
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& mine = calls[i];
    const Call& theirs = calls[(i + 1) % calls.size()];
    if (mine.name == theirs.name) continue;
    CAPTURE(mine.name, theirs.name);
    auto opt = make();
    write_grads(*opt, 0);
    const std::vector<float> before = all_params(*opt);
    const Outcome o = outcome_of([&] { (me == last ? mine : theirs).run(opt); });
    check_different_calls(o, theirs.name, last, mine.name);
    CHECK(bitwise_equal(all_params(*opt), before));
    if (!o.threw || o.code == ErrorCode::timeout) break;  // the communicator is poisoned: stop here
  }
  comm->barrier();
  if (me == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("set_trainable on one rank only is a different-calls mismatch at the others' next call", "[agreement][layout]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  Params params(kSmall);
  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.all()});
  write_grads(opt, 0);
  const Outcome o = outcome_of([&] {
    if (me == last) opt.set_trainable(1, false);
    else opt.step();
  });
  check_different_calls(o, "step()", last, "set_trainable()");
  CHECK(opt.param_step(0) == 0);
}

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

// ---- an invalid value on one rank ------------------------------------------------------------

TEST_CASE("an invalid config or group value on one rank fails construction on every rank", "[agreement][invalid]") {
  auto comm = test_comm();
  const int me = comm->rank(), last = comm->size() - 1;
  Params params(kSmall);

  OptimizerConfig config;
  if (me == last) config.stage = 3;
  Outcome o = outcome_of([&] { ZeroOptimizer(comm, config, {params.all()}); });
  check_invalid_on(o, me, last, {"stage must be 1 or 2, got 3"});

  GroupHyperparams hyper;
  if (me == last) hyper.lr = std::numeric_limits<double>::quiet_NaN();
  o = outcome_of([&] { ZeroOptimizer(comm, OptimizerConfig{}, {params.all(hyper)}); });
  check_invalid_on(o, me, last, {"invalid lr nan"});
}

TEST_CASE("a NaN lr set on one rank refuses the step everywhere and once fixed the optimizer carries on", "[agreement][invalid]") {
  auto comm = test_comm();
  const int me = comm->rank(), last = comm->size() - 1;
  auto solo = comm->split(me, 0);
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  Params params(kSmall, 21);
  ZeroOptimizer opt(comm, config, {params.all()});
  const std::vector<float> before = all_params(opt);
  write_grads(opt, 0);
  const Hyperparams good = opt.hyperparams(0);
  if (me == last) opt.hyperparams(0).lr = std::numeric_limits<double>::quiet_NaN();
  const Outcome o = outcome_of([&] { opt.step(); });
  check_invalid_on(o, me, last, {"invalid lr nan"});
  CHECK(bitwise_equal(all_params(opt), before));
  CHECK(opt.param_step(0) == 0);

  opt.hyperparams(0) = good;
  write_grads(opt, 0);
  const Outcome again = outcome_of([&] { opt.step(); });
  INFO(again.what);
  CHECK_FALSE(again.threw);
  Params solo_params(kSmall, 21);
  ZeroOptimizer reference(solo, config, {solo_params.all()});
  write_grads(reference, 0);
  reference.step();
  CHECK(bitwise_equal(all_params(opt), all_params(reference)));
  CHECK(opt.param_step(0) == 1);
}

TEST_CASE("clip_grad_norm(NaN) or an out-of-range consolidation target on one rank fails on every rank", "[agreement][invalid]") {
  auto comm = test_comm();
  const int me = comm->rank(), last = comm->size() - 1;
  Params params(kSmall);
  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.all()});
  write_grads(opt, 0);
  Outcome o = outcome_of([&] { opt.clip_grad_norm(me == last ? std::numeric_limits<double>::quiet_NaN() : 1.0); });
  check_invalid_on(o, me, last, {"max_norm", "nan"});

  o = outcome_of([&] { opt.consolidate_state_dict(me == last ? 7 : 0); });
  check_invalid_on(o, me, last, {"target rank 7"});
}

// ---- layout changes are eager; getters never communicate ------------------------------------

TEST_CASE("set_trainable rebuilds at the call and getters on one rank never communicate", "[agreement][layout]") {
  auto comm = test_comm();
  const int me = comm->rank();
  auto solo = comm->split(me, 0);
  Params params({{"a", 20}, {"b", 36}, {"c", 12}, {"d", 5}});
  OptimizerConfig config;
  config.bucket_bytes = 64;
  ZeroOptimizer opt(comm, config, {params.group(0, 2), params.group(2, 4)});
  const uint64_t version = opt.layout_version();
  opt.set_trainable(1, false);
  CHECK(opt.layout_version() > version);  // bumped before set_trainable returned
  CHECK_FALSE(opt.trainable(1));
  const uint64_t frozen_version = opt.layout_version();

  // Only rank 0 reads; a getter that communicated would leave the others' step() unmatched.
  int64_t sink = 0;
  if (me == 0) {
    for (int round = 0; round < 50; ++round) {
      for (ParamId id = 0; id < opt.num_params(); ++id) {
        sink += opt.param_owner(id) + (opt.trainable(id) ? 1 : 0) + opt.param_view(id).numel;
        sink += opt.grad_view(id).numel + opt.param_step(id) + opt.param_group(id);
      }
      const MemoryReport report = opt.memory_report();
      sink += report.state_bytes + report.shard_numel + static_cast<int64_t>(opt.layout_version());
      sink += static_cast<int64_t>(opt.hyperparams(0).lr * 1000) + static_cast<int64_t>(opt.defaults().lr * 1000);
      sink += opt.num_params() + opt.num_groups() + opt.find_param("c");
    }
  }
  CHECK(sink >= 0);
  CHECK(opt.layout_version() == frozen_version);  // getters change nothing
  write_grads(opt, 0);
  const Outcome o = outcome_of([&] {
    opt.step();
    write_grads(opt, 1);
    opt.step();
  });
  INFO(o.what);
  CHECK_FALSE(o.threw);
  CHECK(o.seconds < kFastSeconds);

  Params solo_params({{"a", 20}, {"b", 36}, {"c", 12}, {"d", 5}});
  ZeroOptimizer reference(solo, config, {solo_params.group(0, 2), solo_params.group(2, 4)});
  reference.set_trainable(1, false);
  write_grads(reference, 0);
  reference.step();
  write_grads(reference, 1);
  reference.step();
  CHECK(bitwise_equal(all_params(opt), all_params(reference)));
  CHECK(opt.param_step(1) == 0);
  CHECK(opt.param_step(0) == 2);
}

TEST_CASE("load_state_dict of a dict whose values differ on one rank is refused on every rank", "[agreement][arguments]") {
  auto comm = test_comm();
  const int n = comm->size(), me = comm->rank(), last = n - 1;
  if (n < 2) {
    SUCCEED("needs two ranks");
    return;
  }
  // Every rank makes the same dict from a one-rank optimizer of its own.
  Params solo_params(kSmall, 31);
  ZeroOptimizer solo(comm->split(me, 0), OptimizerConfig{}, {solo_params.all()});
  write_grads(solo, 0);
  solo.step();
  solo.consolidate_state_dict(0);
  StateDict dict = solo.state_dict();

  Params params(kSmall, 31);
  ZeroOptimizer opt(comm, OptimizerConfig{}, {params.all()});
  StateDict odd = dict;
  if (me == last) odd.state.begin()->second.tensors.at("exp_avg")[0] += 1.0f;  // one value differs
  const Outcome o = outcome_of([&] { opt.load_state_dict(odd); });
  check_error(o, ErrorCode::mismatch, {"ranks disagree on state dict contents"});
  CHECK(opt.param_step(0) == 0);  // nothing was installed anywhere
  // The same dict on every rank loads.
  opt.load_state_dict(dict);
  CHECK(opt.param_step(0) == 1);
}
