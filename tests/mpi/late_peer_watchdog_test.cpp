// tests/mpi/late_peer_watchdog_test.cpp — collectives on shardopt's internal buffers that a peer joins only after the timeout: Error(timeout) on the caller, and the late peer's data lands in memory that is still allocated.
//
// The late rank runs over a communicator that, once armed, sleeps past the other rank's
// timeout before one chosen collective, then joins it and leaves the call (LeftLate). The other
// rank's collective times out and stays live in MPI; the late rank's data reaches its receive
// buffer only when it next progresses MPI, at exit, long after the call returned and freed what
// it allocated. That buffer must still be allocated then, which the AddressSanitizer build
// checks. One case per run (argv[1]): the communicator is poisoned after it.
//   consolidate: a consolidation chunk, received into the checkpoint staging slot;
//   averager:    ModelAverager's gather of the replica leaders (a stack value and a vector);
//   average:     average_parameters' bucket of two parameters, staged through a copy;
//   mismatch:    the agreement's follow-up after ranks disagree (rank 0's field hashes);
//   join:        the ids of the params sitting a step out, sent to a rank in join().
// A plain program at exactly 2 ranks, as watchdog_test.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/comm_backend.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using shardopt::CommBackend;
using shardopt::Communicator;
using shardopt::DType;
using shardopt::PendingCollective;
using shardopt::ReduceOp;

constexpr double kTimeout = 2.0;
// Rank 0 has left the call (and freed its memory) a second before rank 1 joins, and still
// waits a second for rank 1 at exit (within the timeout, or it would end without MPI_Finalize).
constexpr double kLateBy = kTimeout + 1.0;

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Thrown on the late rank right after it joined the collective it was late for.
struct LeftLate {};

// Which collective the late rank is late for: its name and its size in bytes.
using Trigger = std::function<bool(const std::string& op, int64_t bytes)>;

// Shared by a communicator and those split from it: the optimizer and the averager run their
// collectives over split communicators.
struct Lateness {
  Trigger armed;
  bool fired = false;
};

class LatePeerCommunicator final : public CommBackend {
 public:
  LatePeerCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<Lateness> lateness)
      : inner_(std::move(inner)), lateness_(std::move(lateness)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  shardopt::Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return "late-peer mpi"; }

  void broadcast(void* b, int64_t n, DType d, int root) override {
    run("broadcast", n, d, [&] { inner_->broadcast(b, n, d, root); });
  }
  void all_gather(const void* s, void* r, int64_t n, DType d) override {
    run("all_gather", n, d, [&] { inner_->all_gather(s, r, n, d); });
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType d, ReduceOp op) override {
    run("reduce_scatter", n, d, [&] { inner_->reduce_scatter(s, r, n, d, op); });
  }
  void all_reduce(void* b, int64_t n, DType d, ReduceOp op) override {
    run("all_reduce", n, d, [&] { inner_->all_reduce(b, n, d, op); });
  }
  void reduce(const void* s, void* r, int64_t n, DType d, ReduceOp op, int root) override {
    run("reduce", n, d, [&] { inner_->reduce(s, r, n, d, op, root); });
  }
  void barrier() override { inner_->barrier(); }
  // The nonblocking forms finish before returning: none of the cases here is late for one.
  std::unique_ptr<PendingCollective> broadcast_async(void* b, int64_t n, DType d, int root) override {
    broadcast(b, n, d, root);
    return done();
  }
  std::unique_ptr<PendingCollective> all_gather_async(const void* s, void* r, int64_t n, DType d) override {
    all_gather(s, r, n, d);
    return done();
  }
  std::unique_ptr<PendingCollective> all_reduce_async(void* b, int64_t n, DType d, ReduceOp op) override {
    all_reduce(b, n, d, op);
    return done();
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* s, void* r, int64_t n, DType d,
                                                          ReduceOp op) override {
    reduce_scatter(s, r, n, d, op);
    return done();
  }
  std::unique_ptr<PendingCollective> reduce_async(const void* s, void* r, int64_t n, DType d, ReduceOp op,
                                                  int root) override {
    reduce(s, r, n, d, op, root);
    return done();
  }
  std::shared_ptr<CommBackend> split(int color, int key) override {
    return std::make_shared<LatePeerCommunicator>(inner_->split(color, key), lateness_);
  }

 private:
  struct Finished final : PendingCollective {
    void wait() override {}
  };
  static std::unique_ptr<PendingCollective> done() { return std::make_unique<Finished>(); }

  template <typename Collective>
  void run(const char* op, int64_t count, DType dtype, const Collective& collective) {
    const int64_t bytes = count * static_cast<int64_t>(shardopt::dtype_size(dtype));
    const bool late = lateness_->armed && lateness_->armed(op, bytes);
    if (late) {
      lateness_->armed = nullptr;
      std::this_thread::sleep_for(std::chrono::duration<double>(kLateBy));
    }
    collective();
    if (late) {
      lateness_->fired = true;
      std::printf("rank %d joined %s of %lld bytes %.1f s late\n", rank(), op, static_cast<long long>(bytes),
                  kLateBy);
      throw LeftLate{};
    }
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<Lateness> lateness_;
};

// The other rank: `call` raises Error(timeout) naming every string of `parts`. Rank `late`
// (armed): `call` reaches the collective it is late for, joins it and leaves.
template <typename Call>
void run_case(Communicator& world, Lateness& lateness, int late, const Trigger& trigger,
              const std::vector<std::string>& parts, const Call& call) {
  const std::string me = "rank " + std::to_string(world.rank());
  if (world.rank() != late) {
    try {
      call();
      expect(false, me + ": the call returned although rank " + std::to_string(late) + " was late");
    } catch (const shardopt::Error& e) {
      bool named = e.code() == shardopt::ErrorCode::timeout;
      for (const std::string& part : parts) named = named && contains(e.what(), part);
      expect(named, me + ": unexpected error: " + e.what());
      std::printf("%s: %s\n", me.c_str(), e.what());
    }
    return;
  }
  lateness.armed = trigger;
  try {
    call();
    expect(false, me + ": the call returned without the collective it was to be late for");
  } catch (const LeftLate&) {
    expect(lateness.fired, me + ": left without joining");
  } catch (const shardopt::Error& e) {
    expect(false, me + ": unexpected error: " + e.what());
  }
}

bool is(const std::string& op, const char* name) { return op == name; }

shardopt::ParamSpec param(const char* name, std::vector<float>& values, std::vector<float>* grads = nullptr) {
  shardopt::ParamSpec p;
  p.name = name;
  p.param = shardopt::TensorRef{values.data(), static_cast<int64_t>(values.size())};
  if (grads != nullptr) p.grad = shardopt::TensorRef{grads->data(), static_cast<int64_t>(grads->size())};
  return p;
}

// Consolidation to rank 0 broadcasts rank 1's state in chunks of a staging slot; the length
// before it (8 bytes) goes in time, the chunk late.
void consolidate_case(const std::shared_ptr<Communicator>& world, Lateness& lateness) {
  std::vector<float> values(64, 0.5f);
  shardopt::ParamGroupSpec group;
  group.params.push_back(param("w", values));
  shardopt::OptimizerConfig config;
  config.node_shared_params = false;
  shardopt::ZeroOptimizer opt(world, config, {group});
  const shardopt::TensorRef g = opt.grad_view(0);
  for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 0.25f;
  opt.reduce_gradients();
  opt.step();  // Adam's state now exists on both ranks' shards
  run_case(
      *world, lateness, 1, [](const std::string& op, int64_t bytes) { return is(op, "broadcast") && bytes > 8; },
      {"consolidate_state_dict", "broadcast", "did not complete within 2 s"}, [&] { opt.consolidate_state_dict(0); });
}

// Each rank is a replica of its own; the averager gathers each rank's replica leader (4 bytes)
// over the world, after its agreement (a record of a kilobyte).
void averager_case(const std::shared_ptr<Communicator>& world, Lateness& lateness) {
  std::vector<float> values(64, 0.5f);
  shardopt::ParamGroupSpec group;
  group.params.push_back(param("w", values));
  shardopt::OptimizerConfig config;
  config.node_shared_params = false;
  shardopt::ZeroOptimizer opt(world->split(world->rank(), 0), config, {group});
  run_case(
      *world, lateness, 1, [](const std::string& op, int64_t bytes) { return is(op, "all_gather") && bytes == 4; },
      {"all_gather", "did not complete within 2 s"},
      [&] { shardopt::ModelAverager averager(world, opt, shardopt::periodic_averager(2)); });
}

// Two parameters in the caller's own buffers (external storage), so one averaging bucket packs
// both through a staging copy, which the all-reduce reduces in place.
void average_case(const std::shared_ptr<Communicator>& world, Lateness& lateness) {
  std::vector<float> a(64, 1.0f + static_cast<float>(world->rank()));
  std::vector<float> b(32, 2.0f);
  std::vector<float> grad_a(64, 0.0f);
  std::vector<float> grad_b(32, 0.0f);
  shardopt::ParamGroupSpec group;
  group.params.push_back(param("a", a, &grad_a));
  group.params.push_back(param("b", b, &grad_b));
  shardopt::OptimizerConfig config;
  config.node_shared_params = false;
  config.storage = shardopt::Storage::external;
  shardopt::ZeroOptimizer opt(world->split(world->rank(), 0), config, {group});
  shardopt::ModelAverager averager(world, opt, shardopt::periodic_averager(2));
  expect(averager.next_group_size() == 2, "step 0 averages over both ranks");
  run_case(
      *world, lateness, 1, [](const std::string& op, int64_t) { return is(op, "all_reduce"); },
      {"all_reduce", "did not complete within 2 s"}, [&] { averager.average_parameters(); });
}

// The ranks' learning rates differ: step()'s agreement finds it in round 1, then rank 1 receives
// rank 0's per-field hashes, which rank 0 sends late.
void mismatch_case(const std::shared_ptr<Communicator>& world, Lateness& lateness) {
  std::vector<float> values(64, 0.5f);
  shardopt::ParamGroupSpec group;
  group.params.push_back(param("w", values));
  shardopt::OptimizerConfig config;
  config.node_shared_params = false;
  shardopt::ZeroOptimizer opt(world, config, {group});
  opt.hyperparams(0).lr = world->rank() == 0 ? 0.01 : 0.02;
  run_case(
      *world, lateness, 0, [](const std::string& op, int64_t) { return is(op, "broadcast"); },
      {"step", "broadcast", "did not complete within 2 s"}, [&] { opt.step(); });
}

// Rank 0 steps with param 1 sitting out while rank 1 is in join(): rank 1 learns the ids from
// rank 0, which sends them late.
void join_case(const std::shared_ptr<Communicator>& world, Lateness& lateness) {
  std::vector<float> a(64, 0.5f);
  std::vector<float> b(64, 0.25f);
  shardopt::ParamGroupSpec group;
  group.params.push_back(param("a", a));
  group.params.push_back(param("b", b));
  shardopt::OptimizerConfig config;
  config.node_shared_params = false;
  shardopt::ZeroOptimizer opt(world, config, {group});
  run_case(
      *world, lateness, 0, [](const std::string& op, int64_t bytes) { return is(op, "broadcast") && bytes == 4; },
      {"join", "broadcast", "did not complete within 2 s"},
      [&] { world->rank() == 0 ? opt.step(std::vector<shardopt::ParamId>{1}) : opt.join(); });
}

}  // namespace

int main(int argc, char** argv) {
  shardopt::CommOptions options;
  options.timeout_seconds = kTimeout;
  auto mpi = shardopt::mpi_world(options);
  if (mpi->size() != 2 || argc != 2) {
    std::fprintf(stderr, "usage: mpiexec -n 2 %s consolidate|averager|average|mismatch|join\n", argv[0]);
    return 1;
  }
  const std::string which = argv[1];
  auto lateness = std::make_shared<Lateness>();
  auto world = std::make_shared<Communicator>(std::make_shared<LatePeerCommunicator>(mpi, lateness));
  if (which == "consolidate") {
    consolidate_case(world, *lateness);
  } else if (which == "averager") {
    averager_case(world, *lateness);
  } else if (which == "average") {
    average_case(world, *lateness);
  } else if (which == "mismatch") {
    mismatch_case(world, *lateness);
  } else if (which == "join") {
    join_case(world, *lateness);
  } else {
    std::fprintf(stderr, "unknown case '%s'\n", which.c_str());
    return 1;
  }
  std::printf("rank %d, %s: %s\n", world->rank(), which.c_str(), failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
