// tests/multihost/multihost_probe.cpp — what each rank sees of the hosts it runs on (hostname, MPI_COMM_TYPE_SHARED group, shardopt's node sharing) and a few sharded optimizer steps whose result must not depend on where the ranks run.
//
// Usage: multihost_probe [--steps N] [--pause-ms MS] [--ranks-per-node N] [--timeout S] [--mpi-only 1]
//                        [--stage 1|2] [--inexact 1] [--node-shared 0|1] [--extra-numel N] [--as-ranks V]
//                        [--in-order 1]
// Rank 0 prints one line per rank and a summary line:
//   hosts=H node_sizes=a,b,... node_ranks=a,b,... shared_param_bytes=a,b,... params_fnv=HEX
//   grad_slots=a,b,... reduce_ms=MS
// --inexact 1: gradients whose sums round (the summation order shows in the bits); --as-ranks V
// (one rank only): each step's gradient is V ranks' inexact gradients averaged in the order of
// the slots' tree (average_slots_cpu: halves at the largest power of two, the lower first), the
// reference the multi-rank runs must match bitwise (--in-order 1: summed rank after rank
// instead, a control whose bits must differ). Stage 2 hands each gradient with
// reduce_gradient(). grad_slots: whether the rank's gradients
// are in a node-shared slot; reduce_ms: the slowest rank's median reduce_gradients() (from the
// second step on). --extra-numel adds a parameter of N elements (for timing).
// Exits non-zero when a shared-memory group is not exactly the ranks of one host, or when the
// ranks end with different parameters. --mpi-only 1: MPI alone, no shardopt (the placement
// only; node_ranks and shared_param_bytes are then 0). Named points (test_marks.hpp): "init", "step<k>"
// (before step k's gradients are written, k from 0), "reduce<k>" (just before its
// reduce_gradients()), "done".
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>
#include <unistd.h>

#include "shardopt/shardopt.hpp"
#include "test_marks.hpp"

using namespace shardopt;

namespace {

struct Args {
  int steps = 3;
  int pause_ms = 0;  // sleep before each step, so a fault injected from outside lands mid-run
  int ranks_per_node = 0;
  double timeout = 30;
  bool mpi_only = false;
  int stage = 1;
  bool inexact = false;
  bool node_shared = true;
  int64_t extra_numel = 0;
  int as_ranks = 0;
  bool in_order = false;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "multihost_probe: %s needs a value\n", option.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    if (option == "--steps") {
      args.steps = std::atoi(value);
    } else if (option == "--pause-ms") {
      args.pause_ms = std::atoi(value);
    } else if (option == "--ranks-per-node") {
      args.ranks_per_node = std::atoi(value);
    } else if (option == "--timeout") {
      args.timeout = std::atof(value);
    } else if (option == "--mpi-only") {
      args.mpi_only = std::atoi(value) != 0;
    } else if (option == "--stage") {
      args.stage = std::atoi(value);
    } else if (option == "--inexact") {
      args.inexact = std::atoi(value) != 0;
    } else if (option == "--node-shared") {
      args.node_shared = std::atoi(value) != 0;
    } else if (option == "--extra-numel") {
      args.extra_numel = std::atoll(value);
    } else if (option == "--as-ranks") {
      args.as_ranks = std::atoi(value);
    } else if (option == "--in-order") {
      args.in_order = std::atoi(value) != 0;
    } else {
      std::fprintf(stderr, "multihost_probe: unknown option %s\n", option.c_str());
      std::exit(2);
    }
  }
  return args;
}

// What one rank reports to rank 0 (a fixed-size record, gathered as bytes).
struct Placement {
  char host[64] = {};
  int32_t node_rank = 0;
  int32_t node_size = 0;
  int32_t node_leader = 0;  // world rank of the node's rank 0 (MPI_COMM_TYPE_SHARED)
  int32_t shardopt_node_ranks = 0;
  int64_t shared_param_bytes = 0;
  uint64_t params_fnv = 0;
  int32_t grad_slots = 0;
  double reduce_ms = 0;
};

const std::vector<int64_t> kSizes = {1000, 3, 517, 2049};

// Gradients of k/1024 with small integers k: any order of summing four ranks' values is exact,
// so the averaged gradient, and with it the run, is bitwise the same whatever the placement.
std::vector<float> gradient(int64_t n, int step, int rank, std::size_t param) {
  std::mt19937 gen(static_cast<uint32_t>(1000 * step + 10 * rank + static_cast<int>(param)));
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& x : g) x = static_cast<float>(k(gen)) / 1024.0f;
  return g;
}

// Inexact gradients: values whose sums over ranks round in float.
std::vector<float> inexact_gradient(int64_t n, int step, int rank, std::size_t param) {
  std::mt19937 gen(static_cast<uint32_t>(7919 * step + 131 * rank + static_cast<int>(param)));
  std::uniform_real_distribution<float> x(-1.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& v : g) v = x(gen) * (1.0f + static_cast<float>(rank) / 3.0f);
  return g;
}

// Element i of ranks [lo, hi)'s gradients summed in average_slots_cpu's tree.
float tree_sum(const std::vector<std::vector<float>>& ranks, int lo, int hi, std::size_t i) {
  if (hi - lo == 1) return ranks[static_cast<std::size_t>(lo)][i];
  int split = 1;
  while (split * 2 < hi - lo) split *= 2;
  return tree_sum(ranks, lo, lo + split, i) + tree_sum(ranks, lo + split, hi, i);
}

std::vector<float> rank_gradient(const Args& args, int64_t n, int step, int rank, std::size_t param) {
  if (!args.inexact) return gradient(n, step, rank, param);
  if (args.as_ranks <= 1) return inexact_gradient(n, step, rank, param);
  std::vector<std::vector<float>> ranks;
  for (int r = 0; r < args.as_ranks; ++r) ranks.push_back(inexact_gradient(n, step, r, param));
  std::vector<float> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i) {
    float sum = ranks[0][i];
    // --in-order 1: rank after rank, another order, whose bits must differ (the control).
    for (int r = 1; args.in_order && r < args.as_ranks; ++r) sum += ranks[static_cast<std::size_t>(r)][i];
    if (!args.in_order) sum = tree_sum(ranks, 0, args.as_ranks, i);
    g[i] = sum / static_cast<float>(args.as_ranks);
  }
  return g;
}

// Whether `address` lies in a shared mapping of a shardopt node-shared segment (/dev/shm).
bool in_node_shared_segment(const void* address) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  char line[512];
  bool found = false;
  const auto at = reinterpret_cast<uintptr_t>(address);
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || at < lo || at >= hi) continue;
    found = perms[3] == 's' && std::strstr(line, "/shardopt-") != nullptr;
    break;
  }
  std::fclose(maps);
  return found;
}

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

// Trains kSizes for `args.steps` steps with node-shared parameters; fills the sharing fields
// and the hash of every parameter's bytes.
void train(const std::shared_ptr<Communicator>& comm, const Args& args, Placement& mine) {
  std::vector<std::vector<float>> initial;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.node_shared_params = args.node_shared;
  config.stage = args.stage;
  config.bucket_bytes = 4096;  // several buckets, several broadcasts per shard
  if (args.extra_numel > 0) config.bucket_bytes = 4 << 20;  // timing: buckets as large as a user's
  std::vector<int64_t> sizes = kSizes;
  if (args.extra_numel > 0) sizes.push_back(args.extra_numel);
  ParamGroupSpec group;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    initial.emplace_back(static_cast<std::size_t>(sizes[i]));
    for (float& x : initial.back()) x = dist(gen);
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{initial.back().data(), sizes[i], DType::f32, Device::cpu()};
    group.params.push_back(p);
  }
  ZeroOptimizer opt(comm, config, {group});
  try {
    mine.grad_slots = in_node_shared_segment(opt.grad_view(0).data) ? 1 : 0;
  } catch (const Error&) {
    mine.grad_slots = 0;  // stage 2 where shardopt keeps no whole gradient buffer
  }
  std::vector<double> reduce_ms;
  for (int step = 0; step < args.steps; ++step) {
    if (args.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(args.pause_ms));
    shardopt_multihost::reached("step" + std::to_string(step), comm->rank());
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      const auto g = rank_gradient(args, sizes[static_cast<std::size_t>(id)], step, comm->rank(), static_cast<std::size_t>(id));
      // Stage 2 hands each gradient over (copied into the node's slot where there is one).
      if (args.stage == 2) {
        opt.reduce_gradient(id, TensorRef{const_cast<float*>(g.data()), static_cast<int64_t>(g.size()), DType::f32, Device::cpu()});
      } else {
        std::memcpy(opt.grad_view(id).data, g.data(), g.size() * sizeof(float));
      }
    }
    shardopt_multihost::reached("reduce" + std::to_string(step), comm->rank());
    const auto start = std::chrono::steady_clock::now();
    opt.reduce_gradients();
    reduce_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    opt.step();
  }
  if (reduce_ms.size() > 1) {
    reduce_ms.erase(reduce_ms.begin());  // the first round maps and faults its pages in
    std::sort(reduce_ms.begin(), reduce_ms.end());
    mine.reduce_ms = reduce_ms[reduce_ms.size() / 2];
  }
  const MemoryReport memory = opt.memory_report();
  mine.shardopt_node_ranks = memory.node_ranks;
  mine.shared_param_bytes = memory.node_shared_param_bytes;
  uint64_t hash = 14695981039346656037ull;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef view = opt.param_view(id);
    hash = fnv1a(view.data, view.nbytes(), hash);
  }
  mine.params_fnv = hash;
}

std::string joined(const std::vector<Placement>& all, int64_t (*field)(const Placement&)) {
  std::string out;
  for (const Placement& p : all) out += (out.empty() ? "" : ",") + std::to_string(field(p));
  return out;
}

// Rank 0: prints every rank and the summary; false when the groups or the results disagree.
bool report(const std::vector<Placement>& all) {
  bool ok = true;
  std::vector<std::string> hosts;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const Placement& p = all[r];
    std::printf("rank=%zu host=%s node_rank=%d node_size=%d node_leader=%d shardopt_node_ranks=%d "
                "shared_param_bytes=%" PRId64 " params_fnv=%016" PRIx64 "\n",
                r, p.host, p.node_rank, p.node_size, p.node_leader, p.shardopt_node_ranks, p.shared_param_bytes,
                p.params_fnv);
    bool seen = false;
    for (const std::string& h : hosts) seen = seen || h == p.host;
    if (!seen) hosts.emplace_back(p.host);
    for (std::size_t q = 0; q < all.size(); ++q) {
      const bool same_host = std::strcmp(p.host, all[q].host) == 0;
      const bool same_group = p.node_leader == all[q].node_leader;
      if (same_host != same_group) {
        std::printf("error: ranks %zu (%s) and %zu (%s) are %s hosts but %s shared-memory group\n", r, p.host, q,
                    all[q].host, same_host ? "on the same" : "on different", same_group ? "in one" : "not in one");
        ok = false;
      }
    }
    if (p.params_fnv != all[0].params_fnv) {
      std::printf("error: rank %zu ends with other parameters than rank 0\n", r);
      ok = false;
    }
  }
  double reduce_ms = 0;
  for (const Placement& p : all) reduce_ms = std::max(reduce_ms, p.reduce_ms);
  std::printf("hosts=%zu node_sizes=%s node_ranks=%s shared_param_bytes=%s params_fnv=%016" PRIx64
              " grad_slots=%s reduce_ms=%.3f\n",
              hosts.size(), joined(all, [](const Placement& p) { return int64_t{p.node_size}; }).c_str(),
              joined(all, [](const Placement& p) { return int64_t{p.shardopt_node_ranks}; }).c_str(),
              joined(all, [](const Placement& p) { return p.shared_param_bytes; }).c_str(), all[0].params_fnv,
              joined(all, [](const Placement& p) { return int64_t{p.grad_slots}; }).c_str(), reduce_ms);
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  CommOptions options;
  options.timeout_seconds = args.timeout;
  options.ranks_per_node = args.ranks_per_node;
  std::shared_ptr<Communicator> world;
  if (args.mpi_only) {
    MPI_Init(&argc, &argv);
  } else {
    world = mpi_world(options);  // initialises MPI, and finalises it at exit
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  shardopt_multihost::reached("init", rank);

  Placement mine;
  gethostname(mine.host, sizeof mine.host - 1);
  MPI_Comm shared = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  MPI_Comm_rank(shared, &mine.node_rank);
  MPI_Comm_size(shared, &mine.node_size);
  mine.node_leader = rank;
  MPI_Bcast(&mine.node_leader, 1, MPI_INT32_T, 0, shared);
  MPI_Comm_free(&shared);

  try {
    if (world) train(world, args, mine);
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  shardopt_multihost::reached("done", rank);

  std::vector<Placement> all(static_cast<std::size_t>(size));
  MPI_Gather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
  int ok = rank != 0 || report(all) ? 1 : 0;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (args.mpi_only) MPI_Finalize();
  return ok ? 0 : 1;
}
