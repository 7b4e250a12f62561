// tests/faults/fault_run.cpp — one rank is SIGKILLed inside an optimizer call; the survivors must end with a named Error in bounded time, and the previous checkpoint must load bitwise.
//
//   fault_run run    --dir D --point P --victim R [--timeout S]
//   fault_run verify --dir D
//
// run: trains steps 1 and 2, saves D/ckpt (the previous checkpoint), rehearses the call at P
// to time it, returns to the checkpoint and takes step 3, then enters P again with the victim
// armed to SIGKILL itself halfway through the call's rehearsed time. Every survivor prints one
// line "FAULT-RESULT rank=R ok=0|1 seconds=S code=C what=..." (ok: it raised an Error whose
// message names the call, within the timeout plus slack) and exits.
// verify: on a fresh world, replays steps 1 to 4 from scratch, and loads D/ckpt. The loaded
// parameters must be those after step 2 (the previous checkpoint) or, when the kill came
// after rank 0 committed a save at P, those after step 3 (that save, complete); from there the
// remaining steps must give the replay's parameters byte for byte. Prints "VERIFY ok=0|1".
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/shardopt.hpp"

using namespace shardopt;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kParamNumel[] = {1 << 20, 3 << 19, 1000, 1 << 19};

struct Args {
  std::string mode;
  std::string dir;
  std::string point = "step";
  int victim = -1;
  double timeout = 3.0;
};

Args parse(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--dir") a.dir = value;
    else if (key == "--point") a.point = value;
    else if (key == "--victim") a.victim = std::stoi(value);
    else if (key == "--timeout") a.timeout = std::stod(value);
  }
  return a;
}

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The same values on every rank and run: a cheap hash of (seed, index).
float value_of(uint32_t seed, int64_t i) {
  uint32_t x = seed * 2654435761u ^ static_cast<uint32_t>(i) * 2246822519u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(x % 20001) / 10000.0f - 1.0f;
}

struct Model {
  std::vector<std::vector<float>> initial;
  std::unique_ptr<ZeroOptimizer> opt;

  explicit Model(const std::shared_ptr<Communicator>& comm) {
    ParamGroupSpec group;
    for (std::size_t p = 0; p < std::size(kParamNumel); ++p) {
      initial.emplace_back(static_cast<std::size_t>(kParamNumel[p]));
      for (int64_t i = 0; i < kParamNumel[p]; ++i) initial.back()[static_cast<std::size_t>(i)] = value_of(100 + p, i);
      group.params.push_back(ParamSpec{"p" + std::to_string(p), TensorRef{initial.back().data(), kParamNumel[p]}, TensorRef{}});
    }
    Hyperparams hyper;
    hyper.lr = 0.01;
    hyper.weight_decay = 0.01;
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    opt = std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
  }

  void write_grads(uint32_t seed) {
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      const TensorRef g = opt->grad_view(id);
      for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = value_of(seed * 31 + static_cast<uint32_t>(id), i);
    }
  }
  void train_step(uint32_t seed) {
    write_grads(seed);
    opt->reduce_gradients();
    opt->step();
  }
  std::vector<float> params() const {
    std::vector<float> out;
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      const TensorRef v = opt->param_view(id);
      out.insert(out.end(), v.as<float>(), v.as<float>() + v.numel);
    }
    return out;
  }
};

// The call at `point` as the faulted run makes it.
std::function<void()> call_at(Model& m, const std::string& point, const std::string& ckpt) {
  if (point == "step") return [&m] { m.opt->step(); };
  if (point == "reduce") return [&m] { m.opt->reduce_gradients(); };
  if (point == "save") return [&m, ckpt] { m.opt->save(ckpt); };
  if (point == "load") return [&m, ckpt] { m.opt->load(ckpt); };
  if (point == "consolidate") return [&m] { m.opt->consolidate_state_dict(0); };
  return nullptr;
}

// The optimizer call's name in shardopt's messages.
const char* operation_of(const std::string& point) {
  if (point == "reduce") return "reduce_gradients";
  if (point == "consolidate") return "consolidate_state_dict";
  return point.c_str();
}

int run(const Args& a) {
  CommOptions options;
  options.timeout_seconds = a.timeout;
  std::shared_ptr<Communicator> world = mpi_world(options);
  Model m(world);
  const std::string ckpt = a.dir + "/ckpt";
  const std::function<void()> call = call_at(m, a.point, ckpt);
  if (!call) {
    std::fprintf(stderr, "unknown point '%s'\n", a.point.c_str());
    return 2;
  }
  m.train_step(1);
  m.train_step(2);
  m.opt->save(ckpt);
  // Rehearsal: how long the call takes here, on the victim's own clock.
  m.write_grads(3);
  if (a.point == "step") m.opt->reduce_gradients();
  const auto rehearsal = Clock::now();
  call();
  const double rehearsed = since(rehearsal);
  // Back to the checkpoint's state, then step 3 (a save at P now writes the state after it).
  m.opt->load(ckpt);
  m.train_step(3);
  m.write_grads(4);
  if (a.point == "step") m.opt->reduce_gradients();
  world->barrier();

  // The fault.
  if (world->rank() == a.victim) {
    const auto delay = std::chrono::duration<double>(rehearsed / 2);
    std::fprintf(stderr, "VICTIM rank=%d point=%s rehearsed=%.4fs kill_after=%.4fs\n", a.victim, a.point.c_str(),
                 rehearsed, rehearsed / 2);
    std::thread([delay] {
      std::this_thread::sleep_for(delay);
      raise(SIGKILL);
    }).detach();
  }
  const auto start = Clock::now();
  ErrorCode code = ErrorCode::internal;
  std::string what;
  bool raised = false;
  try {
    call();
    // When the victim died after this rank's last exchange with it, the next call meets its
    // absence. (The victim itself stops after the call, below.)
    if (world->rank() != a.victim) m.opt->step();
  } catch (const Error& e) {
    raised = true;
    code = e.code();
    what = e.what();
  }
  const double seconds = since(start);
  if (world->rank() == a.victim) {
    // The kill did not land inside the call (the rehearsed time was too short to hit): die now,
    // between calls, which the survivors must meet the same way.
    std::fprintf(stderr, "VICTIM rank=%d outlived the call\n", a.victim);
    raise(SIGKILL);
  }
  // The error names the interrupted call (or the step after it) and comes within the timeout
  // plus slack for two calls' own work.
  const bool named = what.rfind(operation_of(a.point), 0) == 0 || what.rfind("step", 0) == 0;
  const bool ok = raised && named && (code == ErrorCode::timeout || code == ErrorCode::comm) &&
                  seconds < 2 * a.timeout + 5.0;
  std::printf("FAULT-RESULT rank=%d ok=%d seconds=%.2f code=%s what=%s\n", world->rank(), ok ? 1 : 0, seconds,
              raised ? error_code_name(code) : "none", what.c_str());
  std::fflush(stdout);
  return 0;
}

int verify(const Args& a) {
  CommOptions options;
  options.timeout_seconds = 30;
  std::shared_ptr<Communicator> world = mpi_world(options);
  // The uninterrupted run, replayed: the parameters after steps 2, 3 and 4.
  Model replay(world);
  std::vector<std::vector<float>> after(5);
  for (uint32_t step = 1; step <= 4; ++step) {
    replay.train_step(step);
    after[step] = replay.params();
  }
  Model resumed(world);
  bool ok = true;
  std::string what;
  try {
    resumed.opt->load(a.dir + "/ckpt");
    const std::vector<float> loaded = resumed.params();
    const uint32_t saved_after = loaded == after[2] ? 2 : loaded == after[3] ? 3 : 0;
    if (saved_after == 0) {
      ok = false;
      what = "the loaded parameters are neither those of the previous checkpoint nor those of the new save";
    } else {
      what = saved_after == 2 ? "the previous checkpoint" : "the new save, committed before the kill";
    }
    for (uint32_t step = saved_after + 1; ok && step <= 4; ++step) {
      resumed.train_step(step);
      if (std::memcmp(resumed.params().data(), after[step].data(), after[step].size() * sizeof(float)) != 0) {
        ok = false;
        what += ", whose resumed step " + std::to_string(step) + " differs from the uninterrupted run's";
      }
    }
  } catch (const Error& e) {
    ok = false;
    what = e.what();
  }
  if (world->rank() == 0) std::printf("VERIFY ok=%d %s\n", ok ? 1 : 0, what.c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.mode == "run" && !a.dir.empty()) return run(a);
  if (a.mode == "verify" && !a.dir.empty()) return verify(a);
  std::fprintf(stderr, "usage: fault_run run|verify --dir D [--point step|reduce|save|load|consolidate] [--victim R] [--timeout S]\n");
  return 2;
}
