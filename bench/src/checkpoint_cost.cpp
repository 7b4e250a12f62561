// bench/src/checkpoint_cost.cpp — times rounds of steps with no save, a blocking save and a background save, and checks that each kind of checkpoint resumes.
#include "checkpoint_cost.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "model.hpp"
#include "support.hpp"

namespace shardopt_bench {
namespace {

using shardopt::ZeroOptimizer;

// Seconds of `body` on the slowest rank, between barriers.
template <typename Body>
double timed(Communicator& comm, const Body& body) {
  comm.barrier();
  const auto start = Clock::now();
  body();
  const double mine = seconds_since(start);
  comm.barrier();
  return slowest_rank(comm, {mine})[0];
}

std::string param_bytes(const ZeroOptimizer& opt) {
  std::string out;
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef v = opt.param_view(id);
    out.append(static_cast<const char*>(v.data), v.nbytes());
  }
  return out;
}

struct Round {
  double save = 0.0;        // save() or save_async()
  double first_step = 0.0;  // the step right after it
  double other_steps = 0.0;  // the rest of the round's steps, together
  double wait = 0.0;        // wait_save()
  double total() const { return save + first_step + other_steps + wait; }
};

}  // namespace

int run_checkpoint_cost(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const Model model = make_model(o);
  shardopt::OptimizerConfig config = make_config(o);
  config.stage = 1;
  ExternalBuffers external;
  std::unique_ptr<ZeroOptimizer> opt = build_optimizer(comm, o, config, model.tensors, external);
  for (int i = 0; i < o.warmup; ++i) opt->step();

  const std::string blocking_dir = o.ckpt_dir + "/blocking";
  const std::string async_dir = o.ckpt_dir + "/async";
  std::vector<double> plain_steps;
  std::vector<Round> blocking, async;
  std::string blocking_params, async_params;
  for (int r = 0; r < o.iters; ++r) {
    for (int s = 0; s < o.save_every; ++s) plain_steps.push_back(timed(*comm, [&] { opt->step(); }));

    Round b;
    blocking_params = param_bytes(*opt);
    b.save = timed(*comm, [&] { opt->save(blocking_dir); });
    b.first_step = timed(*comm, [&] { opt->step(); });
    for (int s = 1; s < o.save_every; ++s) b.other_steps += timed(*comm, [&] { opt->step(); });
    blocking.push_back(b);

    Round a;
    async_params = param_bytes(*opt);
    a.save = timed(*comm, [&] { opt->save_async(async_dir); });
    a.first_step = timed(*comm, [&] { opt->step(); });
    for (int s = 1; s < o.save_every; ++s) a.other_steps += timed(*comm, [&] { opt->step(); });
    a.wait = timed(*comm, [&] { opt->wait_save(); });
    async.push_back(a);
  }

  // Each kind's last checkpoint resumes to the parameters it was taken at.
  opt->load(blocking_dir);
  const bool blocking_ok = param_bytes(*opt) == blocking_params;
  opt->load(async_dir);
  const bool async_ok = param_bytes(*opt) == async_params;
  const int64_t wrong = sum_int64(*comm, blocking_ok && async_ok ? 0 : 1);

  const double step = median(plain_steps);
  const double round_steps = step * o.save_every;
  auto med = [&](const std::vector<Round>& rounds, auto field) {
    std::vector<double> v;
    for (const Round& x : rounds) v.push_back(field(x));
    return median(v) * 1e3;
  };
  const double blocking_visible = med(blocking, [&](const Round& x) { return x.total() - round_steps; });
  const double async_visible = med(async, [&](const Round& x) { return x.total() - round_steps; });
  const shardopt::MemoryReport memory = opt->memory_report();
  say(*comm,
      "mode=checkpoint world={} params={} dtype={} shard_state_bytes={} rounds={} save_every={} step_ms={:.3f} "
      "blocking_save_ms={:.3f} blocking_first_step_ms={:.3f} blocking_visible_ms={:.3f} "
      "async_save_call_ms={:.3f} async_first_step_ms={:.3f} async_other_steps_ms={:.3f} async_wait_save_ms={:.3f} "
      "async_visible_ms={:.3f} visible_async_over_blocking={:.3f} resumed={}\n",
      comm->size(), model.numel, shardopt::dtype_name(o.dtype), memory.state_bytes + memory.master_bytes, o.iters,
      o.save_every, step * 1e3, med(blocking, [](const Round& x) { return x.save; }),
      med(blocking, [](const Round& x) { return x.first_step; }), blocking_visible,
      med(async, [](const Round& x) { return x.save; }), med(async, [](const Round& x) { return x.first_step; }),
      med(async, [](const Round& x) { return x.other_steps; }), med(async, [](const Round& x) { return x.wait; }),
      async_visible, blocking_visible > 0 ? async_visible / blocking_visible : 0.0, wrong == 0 ? "yes" : "no");
  return wrong == 0 ? 0 : 1;
}

}  // namespace shardopt_bench
