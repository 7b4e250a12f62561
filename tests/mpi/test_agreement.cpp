// tests/mpi/test_agreement.cpp — every collective call starts with an agreement: ranks in different calls, an invalid value on one rank, and layout changes fail together, fast, by name.
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
