// tools/shardopt_bench.cpp — nccl-tests-style sweeps of shardopt's collectives, and the full optimizer step timed against a memory roofline measured in the same run.
//
// Run under mpirun. Two modes:
//
//  collectives  One table per collective (all_gather, broadcast, reduce_scatter, all_reduce)
//               over a size sweep, with nccl-tests' columns: size, count, time, algbw, busbw,
//               #wrong. Every timed iteration refills its inputs and checks every element of
//               the result (-c 1), so a collective that moves the wrong bytes cannot look fast.
//
//  step         One ZeroOptimizer over a few big params (f32, or bf16/f16 with fp32 masters),
//               the full step() timed between barriers (median over -n iterations of the
//               slowest rank), then compared with
//               a roofline from memory bandwidths measured in the same run: STREAM's copy and
//               triad plus a kernel with the update rule's own access pattern, over arrays far
//               larger than the last-level cache, with the same threads per rank and every
//               rank streaming at once (they share the memory bus). Afterwards every rank
//               checks that it holds the same parameters as every other rank and as a
//               single-rank reference optimizer that took the same steps.
//
// What the step "must move", per rank r (printed summed over ranks):
//
//   update_bytes  (elements rank r updates) x bytes_per_param: the explicit loads and stores
//                 of the update rule over rank r's shard (replicated: every element; the
//                 flat partition's tail padding is not updated and not counted):
//                   f32:
//                   adam/adamw  28 = read p, g, m, v (16) + write p, m, v (12)
//                   sgd         20 = read p, g, buf (12) + write p, buf (8)   (momentum != 0)
//                               12 = read p, g (8) + write p (4)              (momentum == 0)
//                   bf16/f16 (mixed precision: the fp32 master is the parameter the rule
//                   updates; the 16-bit parameter is only written, rounded from it):
//                   adam/adamw  28 = read g (2) + write p (2) + master r/w (8) + m, v r/w (16)
//                   sgd         20 = read g (2) + write p (2) + master r/w (8) + buf r/w (8)
//                               12 = read g (2) + write p (2) + master r/w (8)
//                 i.e. 2 x sizeof(dtype) + 8 + state r/w: the same totals as f32, over 9
//                 streams instead of 7 (Adam).
//   sync_bytes    2 x sizeof(dtype) x (elements rank r receives): each element of another
//                 rank's shard must be read once (in the peer's memory or a transport buffer)
//                 and written once into this rank's parameter buffer, a memcpy that STREAM's
//                 copy counts as 2 x sizeof(dtype) bytes (8 for f32, 4 for bf16/f16: the
//                 all-gather moves the 16-bit parameters, never the masters). Flat partition:
//                 (N-1) x shard elements, padding included (the all-gather moves it);
//                 sorted_greedy: the other ranks' shards. Sharded runs with world > 1 only:
//                 replicated runs have no sync.
//
// --stage 2 leaves the timed step as it is (the same update and sync); it changes how the
// gradients arrive: before every step, untimed, each rank hands every gradient with
// reduce_gradient() (bucket view; external storage: its buffers) and reduce_gradients()
// reduces them to their owners. Every rank hands the same synthetic gradients, rounded to 4
// significant bits so that every partial sum of up to 16 ranks is exact in any dtype: the
// average is then exactly the gradient, whatever order MPI adds in, and the single-rank
// reference (stage 1, the same gradients) stays bitwise comparable.
//
// Not counted, because a step does not have to move them: the staging copies of external
// storage (a bucket-view step needs none), the second copy a two-copy shared-memory
// transport makes, and write-allocate reads of stored cache lines (STREAM does not count
// those either, so both sides of the ratio leave them out).
//
// The update-shaped bandwidth kernel follows the dtype: f32 reads p, g, m, v and writes p, m,
// v; bf16/f16 reads a 16-bit g, the master, m, v and writes the master, m, v and a 16-bit p.
//
//   roofline_ms        = update_bytes / stream_update_gbps + sync_bytes / stream_copy_gbps
//   achieved_gbps      = (update_bytes + sync_bytes) / step time
//   roofline_fraction  = roofline_ms / step_ms_median   (1.0 = moving bytes as fast as the
//                        measured kernels do; a DRAM roofline, so a step whose buffers fit in
//                        the last-level cache can exceed it)
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <fmt/format.h>

#include "shardopt/shardopt.hpp"
#include "precision.hpp"  // kernels/: bf16/f16 <-> float, the library's own rounding

namespace {

using shardopt::Algorithm;
using shardopt::Communicator;
using shardopt::DType;
using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::ParamSpec;
using shardopt::PartitionStrategy;
using shardopt::ReduceOp;
using shardopt::Storage;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

const char* const usage_text =
    "usage: mpirun -np N shardopt-bench [--mode collectives|step] [options]\n"
    "\n"
    "Sweep options (nccl-tests' names; sizes take K/M/G suffixes, powers of 1024):\n"
    "  -b, --minbytes SIZE       smallest collective size (default 1K)\n"
    "  -e, --maxbytes SIZE       largest collective size (default 16M)\n"
    "  -f, --stepfactor X        multiply the size by X each row (default 2)\n"
    "  -i, --stepbytes SIZE      add SIZE each row instead (used when -f is 1)\n"
    "  -n, --iters N             timed iterations per row or step run (default 20)\n"
    "  -w, --warmup_iters N      untimed iterations first (default 5)\n"
    "  -c, --check 0|1           verify every result (default 1)\n"
    "  -r, --root R              broadcast root (default 0)\n"
    "  --op all_gather|broadcast|reduce_scatter|all_reduce|all   (default all)\n"
    "\n"
    "Step options:\n"
    "  --params N                a model of --tensors equal params totalling N elements\n"
    "  --tensors K               how many params --params is split into (default 4)\n"
    "  --layers L --width W      instead: L x Linear(W, W), i.e. L weights of W*W and L\n"
    "                            biases of W, in torch's order (default 20 x 2000 = 80.04M,\n"
    "                            PyTorch's ZeroRedundancyOptimizer tutorial)\n"
    "  --optimizer sgd|adam|adamw            (default adam; sgd uses --momentum)\n"
    "  --momentum X                          sgd momentum (default 0.9)\n"
    "  --lr X                                learning rate (default 0.001)\n"
    "  --partition flat|sorted_greedy        (default flat)\n"
    "  --storage bucket_view|external        (default bucket_view)\n"
    "  --dtype f32|bf16|f16                  parameter and gradient type (default f32);\n"
    "                                        bf16/f16 keep fp32 masters of each rank's shard:\n"
    "                                        the step updates the masters and writes the\n"
    "                                        16-bit params, and the sync all-gathers 16-bit\n"
    "                                        params. Bytes per updated element (Adam): read g\n"
    "                                        + write p in the dtype, master r/w 8, state r/w\n"
    "                                        16 = 28 (f32: read p,g,m,v + write p,m,v = 28);\n"
    "                                        sync: 2 x sizeof(dtype) per received element\n"
    "  --stage 1|2                           ZeRO stage (default 1; 2 needs the sharded mode).\n"
    "                                        The timed step is the same; at 2 the gradients\n"
    "                                        are handed with reduce_gradient() and reduced to\n"
    "                                        their owners before every step, untimed\n"
    "  --threads T               OpenMP threads per rank, for the update and STREAM (default 1)\n"
    "  --bucket-bytes B          OptimizerConfig::bucket_bytes (default 4 MiB, the library default)\n"
    "  --pipeline-chunk-bytes B  OptimizerConfig::pipeline_chunk_bytes: update and sync in chunks (default 0: off)\n"
    "  --mode sharded|replicated state sharded (default) or replicated, the unsharded\n"
    "                            baseline; implies --mode step (also --shard ...)\n"
    "  --stream-mb M             MiB per bandwidth-test array, 4 arrays per rank\n"
    "                            (default max(2 x last-level cache, 64))\n"
    "  --breakdown               also time the update alone and the sync alone\n"
    "\n"
    "Output (rank 0): collectives print a table per op and '# Wrong values total : N OK|FAILED';\n"
    "step prints one line of key=value pairs (inputs such as dtype=... stage=..., memory such\n"
    "as state_bytes_per_rank (optimizer state), master_bytes_per_rank (fp32 masters) and\n"
    "grad_bytes_per_rank, the largest rank's) ending in step_ms_median=... params_per_s=...\n"
    "achieved_gbps=... roofline_fraction=... wrong=N. Exit status 1 when anything was wrong.\n";

enum class BenchMode { collectives, step };
enum class CollectiveOp { all_gather, broadcast, reduce_scatter, all_reduce };

struct Options {
  BenchMode mode = BenchMode::collectives;
  // Sweep and timing.
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t{16} << 20;
  double step_factor = 2.0;
  int64_t step_bytes = 0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  int root = 0;
  std::vector<CollectiveOp> ops{CollectiveOp::all_gather, CollectiveOp::broadcast,
                                CollectiveOp::reduce_scatter, CollectiveOp::all_reduce};
  // Step.
  int64_t params = 0;  // 0: the --layers x --width model
  int tensors = 4;
  int layers = 20;
  int width = 2000;
  Algorithm algorithm = Algorithm::adam;
  double momentum = 0.9;
  double lr = 1e-3;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  DType dtype = DType::f32;
  int stage = 1;
  int threads = 1;
  int64_t bucket_bytes = shardopt::OptimizerConfig{}.bucket_bytes;
  int64_t pipeline_chunk_bytes = 0;
  bool sharded = true;
  int64_t stream_mb = 0;  // 0: automatic
  bool breakdown = false;
  bool help = false;
};

[[noreturn]] void bad_usage(const std::string& message) { throw std::invalid_argument(message); }

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    bad_usage(fmt::format("{} expects an integer, got '{}'", flag, text));
  }
  if (used != text.size() || value < lo || value > hi) {
    bad_usage(fmt::format("{} expects an integer in [{}, {}], got '{}'", flag, lo, hi, text));
  }
  return value;
}

double parse_double(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    bad_usage(fmt::format("{} expects a number, got '{}'", flag, text));
  }
  if (used != text.size() || !std::isfinite(value)) {
    bad_usage(fmt::format("{} expects a number, got '{}'", flag, text));
  }
  return value;
}

// "64", "1K", "16M", "2G": powers of 1024, as nccl-tests reads its sizes.
int64_t parse_size(const std::string& flag, const std::string& text) {
  if (text.empty()) bad_usage(fmt::format("{} expects a size, got ''", flag));
  int64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = int64_t{1} << 10; break;
    case 'M': case 'm': scale = int64_t{1} << 20; break;
    case 'G': case 'g': scale = int64_t{1} << 30; break;
    default: break;
  }
  if (scale != 1) digits.pop_back();
  const int64_t limit = (int64_t{1} << 62) / scale;
  return parse_int(flag, digits, 0, limit) * scale;
}

std::vector<CollectiveOp> parse_ops(const std::string& text) {
  if (text == "all") return Options{}.ops;
  if (text == "all_gather") return {CollectiveOp::all_gather};
  if (text == "broadcast") return {CollectiveOp::broadcast};
  if (text == "reduce_scatter") return {CollectiveOp::reduce_scatter};
  if (text == "all_reduce") return {CollectiveOp::all_reduce};
  bad_usage("--op expects all_gather, broadcast, reduce_scatter, all_reduce or all, got '" + text + "'");
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (flag.rfind("--", 0) == 0) {
      const std::size_t eq = flag.find('=');
      if (eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        has_inline_value = true;
      }
    }
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (flag == "--breakdown") {
      o.breakdown = true;
      continue;
    }
    if (!has_inline_value) {
      if (i + 1 >= argc) bad_usage(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "-b" || flag == "--minbytes") o.min_bytes = parse_size(flag, value);
    else if (flag == "-e" || flag == "--maxbytes") o.max_bytes = parse_size(flag, value);
    else if (flag == "-f" || flag == "--stepfactor") o.step_factor = parse_double(flag, value);
    else if (flag == "-i" || flag == "--stepbytes") o.step_bytes = parse_size(flag, value);
    else if (flag == "-n" || flag == "--iters") o.iters = static_cast<int>(parse_int(flag, value, 1, 1 << 24));
    else if (flag == "-w" || flag == "--warmup_iters") o.warmup = static_cast<int>(parse_int(flag, value, 0, 1 << 24));
    else if (flag == "-c" || flag == "--check") o.check = parse_int(flag, value, 0, 1) == 1;
    else if (flag == "-r" || flag == "--root") o.root = static_cast<int>(parse_int(flag, value, 0, 1 << 20));
    else if (flag == "--op") o.ops = parse_ops(value);
    else if (flag == "--mode" || flag == "--shard") {
      // One flag names the benchmark (collectives|step) and, for the step, the state mode
      // (sharded|replicated, which imply step).
      if (flag == "--mode" && value == "collectives") o.mode = BenchMode::collectives;
      else if (flag == "--mode" && value == "step") o.mode = BenchMode::step;
      else if (value == "sharded" || value == "replicated") {
        o.mode = BenchMode::step;
        o.sharded = value == "sharded";
      } else {
        bad_usage(flag + " expects collectives, step, sharded or replicated, got '" + value + "'");
      }
    } else if (flag == "--params") o.params = parse_size(flag, value);
    else if (flag == "--tensors") o.tensors = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--layers") o.layers = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--width") o.width = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--optimizer") {
      if (value == "sgd") o.algorithm = Algorithm::sgd;
      else if (value == "adam") o.algorithm = Algorithm::adam;
      else if (value == "adamw") o.algorithm = Algorithm::adamw;
      else bad_usage("--optimizer expects sgd, adam or adamw, got '" + value + "'");
    } else if (flag == "--momentum") o.momentum = parse_double(flag, value);
    else if (flag == "--lr") o.lr = parse_double(flag, value);
    else if (flag == "--partition") {
      if (value == "flat") o.partition = PartitionStrategy::flat;
      else if (value == "sorted_greedy") o.partition = PartitionStrategy::sorted_greedy;
      else bad_usage("--partition expects flat or sorted_greedy, got '" + value + "'");
    } else if (flag == "--storage") {
      if (value == "bucket_view") o.storage = Storage::bucket_view;
      else if (value == "external") o.storage = Storage::external;
      else bad_usage("--storage expects bucket_view or external, got '" + value + "'");
    } else if (flag == "--dtype") {
      if (value == "f32") o.dtype = DType::f32;
      else if (value == "bf16") o.dtype = DType::bf16;
      else if (value == "f16") o.dtype = DType::f16;
      else bad_usage("--dtype expects f32, bf16 or f16, got '" + value + "'");
    } else if (flag == "--stage") o.stage = static_cast<int>(parse_int(flag, value, 1, 2));
    else if (flag == "--threads") o.threads = static_cast<int>(parse_int(flag, value, 0, 1024));
    else if (flag == "--bucket-bytes") o.bucket_bytes = std::max<int64_t>(1, parse_size(flag, value));
    else if (flag == "--pipeline-chunk-bytes") o.pipeline_chunk_bytes = parse_size(flag, value);
    else if (flag == "--stream-mb") o.stream_mb = parse_int(flag, value, 1, int64_t{1} << 20);
    else bad_usage("unknown option '" + flag + "'");
  }
  if (o.min_bytes > o.max_bytes) {
    bad_usage(fmt::format("-b ({}) is larger than -e ({})", o.min_bytes, o.max_bytes));
  }
  if (o.stage == 2 && !o.sharded) {
    bad_usage("--stage 2 shards the gradients by the state's partition; it needs --mode sharded");
  }
  if (o.step_factor <= 1.0 && o.step_bytes <= 0 && o.min_bytes != o.max_bytes) {
    bad_usage("-f must be > 1, or -i must be positive, for the sweep to advance");
  }
  return o;
}

// ---- small helpers ----------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Every rank's value, in rank order. bf16 collectives move raw 16-bit words (MPI_UINT16_T,
// no arithmetic), so four of them carry an int64 exactly, which f32 could not.
std::vector<int64_t> gather_int64(Communicator& comm, int64_t value) {
  std::vector<int64_t> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = value;
  constexpr int64_t words = sizeof(int64_t) / 2;
  comm.all_gather(&all[static_cast<std::size_t>(comm.rank())], all.data(), words, DType::bf16);
  return all;
}

int64_t sum_int64(Communicator& comm, int64_t value) {
  int64_t total = 0;
  for (int64_t v : gather_int64(comm, value)) total += v;
  return total;
}

int64_t max_int64(Communicator& comm, int64_t value) {
  const std::vector<int64_t> all = gather_int64(comm, value);
  return *std::max_element(all.begin(), all.end());
}

// Per-iteration seconds -> the slowest rank's seconds for each iteration. What a user waits
// for is the last rank to finish.
std::vector<double> slowest_rank(Communicator& comm, const std::vector<double>& seconds) {
  std::vector<float> buffer(seconds.begin(), seconds.end());
  if (!buffer.empty()) comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), DType::f32, ReduceOp::max);
  return std::vector<double>(buffer.begin(), buffer.end());
}

// Rank 0 prints; everyone else stays quiet. Flushed at once so mpirun's output keeps order.
template <typename... Args>
void say(const Communicator& comm, fmt::format_string<Args...> format, Args&&... args) {
  if (comm.rank() != 0) return;
  fmt::print(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

int effective_threads(int threads) {
#ifdef _OPENMP
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

// ---- collectives ------------------------------------------------------------------------------

struct OpTraits {
  const char* name;
  const char* redop;     // "sum" or "none"
  const char* placement; // printed above the table
  bool rooted;
  bool split_over_ranks;  // count must be a multiple of the world size
};

OpTraits traits(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather:
      return {"all_gather", "none",
              "in place, as the optimizer's parameter sync; size = the whole gathered buffer", false, true};
    case CollectiveOp::broadcast:
      return {"broadcast", "none", "in place; size = the broadcast buffer", true, false};
    case CollectiveOp::reduce_scatter:
      return {"reduce_scatter", "sum", "out of place; size = the whole input buffer", false, true};
    case CollectiveOp::all_reduce:
      return {"all_reduce", "sum", "in place; size = the buffer", false, false};
  }
  return {"?", "?", "", false, false};
}

// nccl-tests' bus bandwidth factors: what each rank's link carries relative to algbw for the
// bandwidth-optimal algorithm, so that busbw is comparable across ops and world sizes.
double bus_factor(CollectiveOp op, int world) {
  const double n = world;
  switch (op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: return (n - 1) / n;
    case CollectiveOp::all_reduce: return 2 * (n - 1) / n;
    case CollectiveOp::broadcast: return 1.0;
  }
  return 1.0;
}

// Small non-negative integers: exact in f32, and so are their sums over up to 2^14 ranks in
// any order, so a reduction's expected value does not depend on the algorithm MPI picked.
// Depending on the iteration makes a collective that left last iteration's data show up.
float pattern(int rank, int64_t index, int iteration) {
  return static_cast<float>((int64_t{rank + 1} * 131 + index * 7 + int64_t{iteration} * 17) % 1021);
}
constexpr float kSentinel = -1.f;  // never a pattern value: marks bytes nobody wrote

float pattern_sum(int world, int64_t index, int iteration) {
  float sum = 0.f;
  for (int r = 0; r < world; ++r) sum += pattern(r, index, iteration);
  return sum;
}

struct SweepRow {
  int64_t bytes = 0;
  int64_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = 0;
};

class CollectiveBench {
 public:
  CollectiveBench(Communicator& comm, const Options& options, CollectiveOp op)
      : comm_(comm), options_(options), op_(op), world_(comm.size()), rank_(comm.rank()) {}

  // Elements in the row of `bytes` (rounded down to a multiple of the world for split ops).
  int64_t count_for(int64_t bytes) const {
    int64_t count = bytes / static_cast<int64_t>(sizeof(float));
    if (traits(op_).split_over_ranks) count = count / world_ * world_;
    return count;
  }

  SweepRow run(int64_t count) {
    const int total = options_.warmup + options_.iters;
    allocate(count);
    std::vector<double> seconds;
    int64_t wrong = 0;
    for (int it = 0; it < total; ++it) {
      if (options_.check || it == 0) fill(count, it);
      comm_.barrier();
      const auto start = Clock::now();
      issue(count);
      const double elapsed = seconds_since(start);
      if (it < options_.warmup) continue;
      seconds.push_back(elapsed);
      if (options_.check) wrong += verify(count, it);
    }
    SweepRow row;
    row.count = count;
    row.bytes = count * static_cast<int64_t>(sizeof(float));
    const double t = median(slowest_rank(comm_, seconds));
    row.time_us = t * 1e6;
    row.algbw = t > 0 ? static_cast<double>(row.bytes) / t / 1e9 : 0.0;
    row.busbw = row.algbw * bus_factor(op_, world_);
    row.wrong = options_.check ? sum_int64(comm_, wrong) : -1;
    return row;
  }

 private:
  void allocate(int64_t count) {
    const auto n = static_cast<std::size_t>(count);
    if (op_ == CollectiveOp::reduce_scatter) {
      if (send_.size() < n) send_.resize(n);
      if (recv_.size() < n / static_cast<std::size_t>(world_)) recv_.resize(n / static_cast<std::size_t>(world_));
    } else if (recv_.size() < n) {
      recv_.resize(n);
    }
  }

  int64_t block(int64_t count) const { return count / world_; }

  void fill(int64_t count, int it) {
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        for (int r = 0; r < world_; ++r) {
          for (int64_t i = 0; i < c; ++i) recv_[static_cast<std::size_t>(r * c + i)] = r == rank_ ? pattern(r, i, it) : kSentinel;
        }
        break;
      }
      case CollectiveOp::broadcast:
        for (int64_t i = 0; i < count; ++i) recv_[static_cast<std::size_t>(i)] = rank_ == options_.root ? pattern(rank_, i, it) : kSentinel;
        break;
      case CollectiveOp::reduce_scatter:
        for (int64_t i = 0; i < count; ++i) send_[static_cast<std::size_t>(i)] = pattern(rank_, i, it);
        for (int64_t i = 0; i < block(count); ++i) recv_[static_cast<std::size_t>(i)] = kSentinel;
        break;
      case CollectiveOp::all_reduce:
        for (int64_t i = 0; i < count; ++i) recv_[static_cast<std::size_t>(i)] = pattern(rank_, i, it);
        break;
    }
  }

  void issue(int64_t count) {
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        comm_.all_gather(recv_.data() + rank_ * c, recv_.data(), c, DType::f32);
        break;
      }
      case CollectiveOp::broadcast: comm_.broadcast(recv_.data(), count, DType::f32, options_.root); break;
      case CollectiveOp::reduce_scatter:
        comm_.reduce_scatter(send_.data(), recv_.data(), block(count), DType::f32, ReduceOp::sum);
        break;
      case CollectiveOp::all_reduce: comm_.all_reduce(recv_.data(), count, DType::f32, ReduceOp::sum); break;
    }
  }

  // Elements of this rank's result that differ from what the collective had to produce.
  int64_t verify(int64_t count, int it) const {
    int64_t wrong = 0;
    auto expect = [&](std::size_t at, float expected) { wrong += recv_[at] != expected ? 1 : 0; };
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        for (int r = 0; r < world_; ++r) {
          for (int64_t i = 0; i < c; ++i) expect(static_cast<std::size_t>(r * c + i), pattern(r, i, it));
        }
        break;
      }
      case CollectiveOp::broadcast:
        for (int64_t i = 0; i < count; ++i) expect(static_cast<std::size_t>(i), pattern(options_.root, i, it));
        break;
      case CollectiveOp::reduce_scatter: {
        const int64_t c = block(count);
        for (int64_t i = 0; i < c; ++i) expect(static_cast<std::size_t>(i), pattern_sum(world_, rank_ * c + i, it));
        break;
      }
      case CollectiveOp::all_reduce:
        for (int64_t i = 0; i < count; ++i) expect(static_cast<std::size_t>(i), pattern_sum(world_, i, it));
        break;
    }
    return wrong;
  }

  Communicator& comm_;
  const Options& options_;
  CollectiveOp op_;
  int world_;
  int rank_;
  std::vector<float> send_;
  std::vector<float> recv_;
};

int run_collectives(Communicator& comm, const Options& options) {
  if (options.root >= comm.size()) {
    bad_usage(fmt::format("-r {} is not a rank of this {}-rank job", options.root, comm.size()));
  }
  say(comm, "# shardopt-bench collectives: world {}, backend {}, type float, iters {}, warmup {}, check {}\n",
      comm.size(), comm.backend_name(), options.iters, options.warmup, options.check ? 1 : 0);
  say(comm, "# time: median over the iterations of the slowest rank; algbw = size / time; "
            "busbw = algbw x nccl-tests' bus factor\n");
  int64_t wrong_total = 0;
  double busbw_sum = 0;
  int rows = 0;
  for (CollectiveOp op : options.ops) {
    const OpTraits t = traits(op);
    CollectiveBench bench(comm, options, op);
    say(comm, "#\n# {} ({})\n", t.name, t.placement);
    say(comm, "# {:>12} {:>13} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}\n", "size", "count", "type",
        "redop", "root", "time", "algbw", "busbw", "#wrong");
    say(comm, "# {:>12} {:>13} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}\n", "(B)", "(elements)", "", "",
        "", "(us)", "(GB/s)", "(GB/s)", "");
    int64_t previous_count = -1;
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
      const int64_t count = bench.count_for(bytes);
      // Sizes that round to the same element count would repeat a row.
      if (count != previous_count) {
        previous_count = count;
        const SweepRow row = bench.run(count);
        const std::string wrong = options.check ? std::to_string(row.wrong) : "N/A";
        say(comm, "  {:>12} {:>13} {:>7} {:>6} {:>5} {:>11.2f} {:>9.3f} {:>9.3f} {:>7}\n", row.bytes,
            row.count, "float", t.redop, t.rooted ? options.root : -1, row.time_us, row.algbw, row.busbw, wrong);
        if (options.check) wrong_total += row.wrong;
        busbw_sum += row.busbw;
        ++rows;
      }
      const int64_t next = options.step_factor > 1.0
                               ? static_cast<int64_t>(std::ceil(static_cast<double>(std::max<int64_t>(bytes, 1)) * options.step_factor))
                               : bytes + options.step_bytes;
      if (next <= bytes) break;
      bytes = next;
    }
  }
  say(comm, "#\n# Wrong values total   : {} {}\n", options.check ? std::to_string(wrong_total) : "N/A",
      wrong_total == 0 ? "OK" : "FAILED");
  say(comm, "# Avg bus bandwidth    : {:.3f} GB/s\n", rows > 0 ? busbw_sum / rows : 0.0);
  return wrong_total == 0 ? 0 : 1;
}

// ---- the model and its synthetic values -------------------------------------------------------

struct Tensor {
  std::string name;
  int64_t offset = 0;  // first element in the concatenated model
  int64_t numel = 0;
};

struct Model {
  std::vector<Tensor> tensors;
  int64_t numel = 0;
  std::string description;
};

Model make_model(const Options& o) {
  Model m;
  auto add = [&](std::string name, int64_t numel) {
    m.tensors.push_back(Tensor{std::move(name), m.numel, numel});
    m.numel += numel;
  };
  if (o.params > 0) {
    // Equal params, the last one taking the remainder (sizes need not divide anything).
    const int64_t k = std::min<int64_t>(o.tensors, o.params);
    const int64_t base = o.params / k;
    for (int64_t i = 0; i < k; ++i) add(fmt::format("p{}", i), i + 1 < k ? base : o.params - base * (k - 1));
    m.description = fmt::format("tensors={}", k);
  } else {
    const int64_t w = o.width;
    for (int l = 0; l < o.layers; ++l) {
      add(fmt::format("{}.weight", l), w * w);
      add(fmt::format("{}.bias", l), w);
    }
    m.description = fmt::format("layers={} width={}", o.layers, o.width);
  }
  return m;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A value in [-scale, scale) that depends only on (stream, global element index): every rank
// and the reference rebuild the same parameters and gradients without storing or sending them.
float synthetic(uint64_t stream, int64_t index, float scale) {
  const uint64_t h = splitmix64(splitmix64(stream) ^ static_cast<uint64_t>(index));
  return static_cast<float>(static_cast<int32_t>(h >> 32)) * (scale / 2147483648.0f);
}
constexpr uint64_t kParamStream = 1;
constexpr uint64_t kGradStream = 2;
constexpr float kParamScale = 0.05f;
constexpr float kGradScale = 0.01f;

// Rounds to 4 significant bits (towards zero): k x such a value is exact in bf16 (8 bits),
// f16 and f32 for every k <= 16, so sums of up to 16 ranks' copies are exact in any order.
float four_bits(float x) { return shardopt::kernels::bits_float(shardopt::kernels::float_bits(x) & 0xfff00000u); }

// Synthetic values of global elements [first_index, first_index + out.numel) into a buffer of
// out.dtype (bf16/f16: rounded to nearest even from the f32 value).
void fill_synthetic(const TensorRef& out, int64_t first_index, uint64_t stream, float scale, bool coarse,
                    int threads) {
  const int64_t n = out.numel;
  const auto value = [&](int64_t i) {
    const float v = synthetic(stream, first_index + i, scale);
    return coarse ? four_bits(v) : v;
  };
  switch (out.dtype) {
    case DType::f32: {
      float* p = out.as<float>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = value(i);
      break;
    }
    case DType::bf16: {
      uint16_t* p = out.as<uint16_t>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = shardopt::kernels::float_to_bf16(value(i));
      break;
    }
    case DType::f16: {
      uint16_t* p = out.as<uint16_t>();
#pragma omp parallel for num_threads(effective_threads(threads)) schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = shardopt::kernels::float_to_f16(value(i));
      break;
    }
    case DType::byte: break;  // the bench never makes byte tensors
  }
}

// Stage 2 hands gradients that several ranks sum exactly (see the top of the file).
bool coarse_gradients(const Options& o) { return o.stage == 2; }

// The step's owned buffers for external storage (bucket view keeps them inside shardopt), as
// raw words of the dtype (f32: one word per element; bf16/f16: half a word).
struct ExternalBuffers {
  std::vector<float> params;
  std::vector<float> grads;
};

// Builds an optimizer over `pieces` of the model ([first, first+numel) ranges of global
// indices) with synthetic initial values and gradients (not for stage 2 with bucket view,
// which has no gradient views: see hand_gradients).
std::unique_ptr<ZeroOptimizer> build_optimizer(std::shared_ptr<Communicator> comm, const Options& o,
                                               OptimizerConfig config, const std::vector<Tensor>& pieces,
                                               ExternalBuffers& external) {
  ParamGroupSpec group;
  group.hyper.lr = o.lr;
  if (o.algorithm == Algorithm::sgd) group.hyper.momentum = o.momentum;
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  int64_t total = 0;
  for (const Tensor& t : pieces) total += t.numel;
  if (config.storage == Storage::external) {
    const auto words = static_cast<std::size_t>((total * element_bytes + 3) / 4);
    external.params.assign(words, 0.f);
    external.grads.assign(words, 0.f);
  }
  int64_t at = 0;
  for (const Tensor& t : pieces) {
    ParamSpec spec;
    spec.name = t.name;
    spec.param = TensorRef{nullptr, t.numel, o.dtype, shardopt::Device::cpu()};
    spec.grad = spec.param;
    if (config.storage == Storage::external) {
      spec.param.data = reinterpret_cast<char*>(external.params.data()) + at * element_bytes;
      spec.grad.data = reinterpret_cast<char*>(external.grads.data()) + at * element_bytes;
    }
    at += t.numel;
    group.params.push_back(std::move(spec));
  }
  // Values are written through the views after construction, so that no extra full copy of
  // the initial parameters inflates the peak RSS that the step reports.
  const bool grad_views = !(config.stage == 2 && config.storage == Storage::bucket_view);
  auto opt = std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{std::move(group)});
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& t = pieces[i];
    const auto id = static_cast<shardopt::ParamId>(i);
    fill_synthetic(opt->param_view(id), t.offset, kParamStream, kParamScale, false, o.threads);
    if (grad_views) fill_synthetic(opt->grad_view(id), t.offset, kGradStream, kGradScale, coarse_gradients(o), o.threads);
  }
  return opt;
}

// Stage 2, before every step (untimed): every rank hands the same synthetic gradients (bucket
// view: one param at a time through `scratch`, in registration order; external: they are
// already in its buffers) and reduce_gradients() averages them into their owners' shards.
void hand_gradients(ZeroOptimizer& opt, const Options& o, const std::vector<Tensor>& pieces,
                    std::vector<float>& scratch) {
  if (o.storage == Storage::bucket_view) {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Tensor& t = pieces[i];
      const auto words = static_cast<std::size_t>((t.numel * static_cast<int64_t>(shardopt::dtype_size(o.dtype)) + 3) / 4);
      if (scratch.size() < words) scratch.resize(words);
      const TensorRef grad{scratch.data(), t.numel, o.dtype, shardopt::Device::cpu()};
      fill_synthetic(grad, t.offset, kGradStream, kGradScale, true, o.threads);
      opt.reduce_gradient(static_cast<shardopt::ParamId>(i), grad);
    }
  }
  opt.reduce_gradients();
}

OptimizerConfig make_config(const Options& o) {
  OptimizerConfig config;
  config.algorithm = o.algorithm;
  config.partition = o.partition;
  config.storage = o.storage;
  config.shard_state = o.sharded;
  config.stage = o.stage;
  config.cpu_threads = o.threads;
  config.bucket_bytes = o.bucket_bytes;
  config.pipeline_chunk_bytes = o.pipeline_chunk_bytes;
  return config;
}

// ---- STREAM ------------------------------------------------------------------------------------

struct StreamResult {
  // GB/s summed over ranks, all streaming at once.
  double copy_gbps = 0;
  double triad_gbps = 0;
  double update_gbps = 0;  // the update's own access pattern (see measure_stream)
  int64_t array_bytes = 0;  // per array per rank
};

int64_t last_level_cache_bytes() {
  long bytes = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{32} << 20;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedArray = std::unique_ptr<float, AlignedFree>;

AlignedArray aligned_floats(int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedArray(static_cast<float*>(p));
}

// The update rule's memory access pattern with trivial arithmetic: the same streams, read
// and written, as the step's kernel, so the roofline is what this pattern can move.
enum class UpdateShape { adam, sgd_momentum, sgd };
UpdateShape update_shape(const Options& o) {
  if (o.algorithm != Algorithm::sgd) return UpdateShape::adam;
  return o.momentum != 0.0 ? UpdateShape::sgd_momentum : UpdateShape::sgd;
}

// Explicit loads + stores of the update rule per updated element (see the top of the file).
// f32: read p and g, write p (12) plus the state; bf16/f16: read g and write p in the dtype,
// read and write the fp32 master (8) plus the state. The state is fp32 r/w: 16 (Adam's m and
// v), 8 (SGD's momentum buffer) or 0.
int64_t update_bytes_per_param(UpdateShape shape, DType dtype) {
  const int64_t state = shape == UpdateShape::adam ? 16 : shape == UpdateShape::sgd_momentum ? 8 : 0;
  const int64_t param = dtype == DType::f32 ? 12 : 2 * static_cast<int64_t>(shardopt::dtype_size(dtype)) + 8;
  return param + state;
}

// STREAM's copy (c = a, 8 B/element) and triad (a = b + s*c, 12 B/element), and a kernel
// shaped like the update (adam: p, g, m, v read and p, m, v written, 28 B/element), over
// arrays far larger than the last-level cache, with the step's threads per rank and every
// rank at once. Each repetition starts on a barrier and lasts as long as its slowest rank;
// the best repetition counts, as in STREAM.
//
// Why the third kernel: one core's bandwidth is bounded by how many cache misses it keeps in
// flight, which grows with the number of streams. On the 2-core VM these numbers come from,
// copy (2 streams) reaches ~4.7 GB/s, triad (3) ~5.5 and the 7-stream Adam shape ~9 GB/s, so
// triad alone would put a well-vectorised Adam step far above "100% of the roofline".
//
// bf16/f16: the update-shaped kernel reads a 16-bit gradient, the master, m and v and writes
// the master, m, v and a 16-bit parameter (9 streams for Adam), two extra 16-bit arrays of the
// same length; copy and triad stay f32 (a copy's GB/s do not depend on the element type).
StreamResult measure_stream(Communicator& comm, int threads, int64_t array_mb, UpdateShape shape, DType dtype) {
  StreamResult result;
  const int64_t auto_bytes = std::max<int64_t>(2 * last_level_cache_bytes(), int64_t{64} << 20);
  result.array_bytes = array_mb > 0 ? array_mb << 20 : auto_bytes;
  const int64_t n = result.array_bytes / static_cast<int64_t>(sizeof(float));
  AlignedArray owners[4] = {aligned_floats(n), aligned_floats(n), aligned_floats(n), aligned_floats(n)};
  float* const a = owners[0].get();
  float* const b = owners[1].get();
  float* const c = owners[2].get();
  float* const d = owners[3].get();
  // 16-bit gradient and parameter arrays (mixed precision only).
  const bool half = dtype != DType::f32;
  AlignedArray half_owners[2] = {aligned_floats(half ? (n + 1) / 2 : 1), aligned_floats(half ? (n + 1) / 2 : 1)};
  auto* const g16 = reinterpret_cast<uint16_t*>(half_owners[0].get());
  auto* const p16 = reinterpret_cast<uint16_t*>(half_owners[1].get());
  const int team = effective_threads(threads);
  // First touch by the same static schedule that the kernels use, so each thread's pages are
  // where it runs. Values stay normal floats through every kernel (no denormal slow paths).
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 1.0f;
    b[i] = 2.0f;
    c[i] = 0.5f;
    d[i] = 0.25f;
  }
  if (half) {
#pragma omp parallel for num_threads(team) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      g16[i] = 0x4000u;  // 2.0 as bf16, as b
      p16[i] = 0u;
    }
  }
  // The 16-bit streams with trivial conversions (a shift each way: bf16's, whatever the dtype,
  // as only the bytes moved matter here).
  const auto widen16 = [](uint16_t h) { return shardopt::kernels::bf16_to_float(h); };
  const auto narrow16 = [](float x) { return static_cast<uint16_t>(shardopt::kernels::float_bits(x) >> 16); };
  constexpr int kReps = 6;
  std::vector<double> copy_s, triad_s, update_s;
  auto timed = [&](std::vector<double>& out, const auto& kernel) {
    comm.barrier();
    const auto start = Clock::now();
    kernel();
    out.push_back(seconds_since(start));
  };
  for (int rep = 0; rep < kReps; ++rep) {
    timed(copy_s, [&] {
#pragma omp parallel for num_threads(team) schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i];
    });
    timed(triad_s, [&] {
#pragma omp parallel for num_threads(team) schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    });
    // p = a, g = b, m = c, v = d; mixed precision: master = a, g = g16, p = p16.
    timed(update_s, [&] {
      if (half) {
        switch (shape) {
          case UpdateShape::adam:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float g = widen16(g16[i]);
              const float m = 0.9f * c[i] + 0.1f * g;
              const float v = 0.999f * d[i] + 0.001f * g * g;
              c[i] = m;
              d[i] = v;
              const float p = a[i] - 1e-3f * m * v;
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
          case UpdateShape::sgd_momentum:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float m = 0.9f * c[i] + widen16(g16[i]);
              c[i] = m;
              const float p = a[i] - 1e-3f * m;
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
          case UpdateShape::sgd:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float p = a[i] - 1e-3f * widen16(g16[i]);
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
        }
        return;
      }
      switch (shape) {
        case UpdateShape::adam:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) {
            const float m = 0.9f * c[i] + 0.1f * b[i];
            const float v = 0.999f * d[i] + 0.001f * b[i] * b[i];
            c[i] = m;
            d[i] = v;
            a[i] = a[i] - 1e-3f * m * v;
          }
          break;
        case UpdateShape::sgd_momentum:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) {
            const float m = 0.9f * c[i] + b[i];
            c[i] = m;
            a[i] = a[i] - 1e-3f * m;
          }
          break;
        case UpdateShape::sgd:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) a[i] = a[i] - 1e-3f * b[i];
          break;
      }
    });
  }
  // The results are read, so the loops cannot be dropped as dead stores.
  volatile float sink = a[n / 2] + c[n / 3] + d[n / 5] + (half ? widen16(p16[n / 7]) : 0.f);
  (void)sink;
  // The first repetition also pays for warming TLBs and the thread team; STREAM skips it.
  auto best_gbps = [&](const std::vector<double>& seconds, int64_t bytes_per_element) {
    const std::vector<double> slowest = slowest_rank(comm, seconds);
    const double best = *std::min_element(slowest.begin() + 1, slowest.end());
    return static_cast<double>(comm.size()) * static_cast<double>(n) * static_cast<double>(bytes_per_element) / best / 1e9;
  };
  result.copy_gbps = best_gbps(copy_s, 8);
  result.triad_gbps = best_gbps(triad_s, 12);
  result.update_gbps = best_gbps(update_s, update_bytes_per_param(shape, dtype));
  return result;
}

// ---- step ---------------------------------------------------------------------------------------

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// Times `body` (a collective step of every rank) `iters` times after `warmup` untimed calls,
// each between barriers; returns the median of the slowest rank's seconds. `prepare` runs
// untimed before every call (warmup ones included).
template <typename Body, typename Prepare>
double time_collectively(Communicator& comm, int warmup, int iters, const Body& body, const Prepare& prepare) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    body();
  }
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    prepare();
    comm.barrier();
    const auto start = Clock::now();
    body();
    seconds.push_back(seconds_since(start));
    comm.barrier();
  }
  return median(slowest_rank(comm, seconds));
}

template <typename Body>
double time_collectively(Communicator& comm, int warmup, int iters, const Body& body) {
  return time_collectively(comm, warmup, iters, body, [] {});
}

// Elements [lo, hi) of the concatenated model, as pieces of its tensors.
std::vector<Tensor> model_slice(const Model& model, int64_t lo, int64_t hi) {
  std::vector<Tensor> pieces;
  for (const Tensor& t : model.tensors) {
    const int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a < b) pieces.push_back(Tensor{fmt::format("{}[{}:{}]", t.name, a - t.offset, b - t.offset), a, b - a});
  }
  return pieces;
}

// Parameters of this rank that differ bitwise from a single-rank optimizer that took the
// same `steps` steps. Each rank checks its own 1/N slice of the model: the update rules are
// elementwise and step counts agree, so a slice is a faithful reference, and the N ranks
// together cover every element at 1/N of the cost. Together with the cross-rank checksum,
// this covers every parameter on every rank.
int64_t wrong_vs_reference(const std::shared_ptr<Communicator>& solo, const Options& o, const Model& model,
                           const ZeroOptimizer& opt, int rank, int world, int steps) {
  const int64_t lo = model.numel * rank / world, hi = model.numel * (rank + 1) / world;
  const std::vector<Tensor> pieces = model_slice(model, lo, hi);
  if (pieces.empty()) return 0;
  OptimizerConfig config = make_config(o);
  config.storage = Storage::bucket_view;
  config.partition = PartitionStrategy::flat;
  config.shard_state = true;
  config.stage = 1;  // the gradients stand as written: what a stage-2 reduce of them averages to
  ExternalBuffers unused;
  std::unique_ptr<ZeroOptimizer> reference = build_optimizer(solo, o, config, pieces, unused);
  for (int s = 0; s < steps; ++s) reference->step();
  int64_t wrong = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& piece = pieces[i];
    // The model tensor this piece came from, and where the piece starts inside it.
    std::size_t owner = 0;
    while (model.tensors[owner].offset + model.tensors[owner].numel <= piece.offset) ++owner;
    const int64_t inside = piece.offset - model.tensors[owner].offset;
    const TensorRef got = opt.param_view(static_cast<shardopt::ParamId>(owner));
    const TensorRef want = reference->param_view(static_cast<shardopt::ParamId>(i));
    const auto count = [&](const auto* g, const auto* w) {
      for (int64_t k = 0; k < piece.numel; ++k) wrong += g[inside + k] != w[k] ? 1 : 0;
    };
    if (o.dtype == DType::f32) count(got.as<const uint32_t>(), want.as<const uint32_t>());
    else count(got.as<const uint16_t>(), want.as<const uint16_t>());
  }
  return wrong;
}

int run_step(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const int world = comm->size();
  const int rank = comm->rank();
  const Model model = make_model(o);
  const OptimizerConfig config = make_config(o);
  const bool sharded = o.sharded && world > 1;
  // The process before the model exists (MPI, libraries), to set peak RSS against.
  const int64_t base_rss = max_int64(*comm, peak_rss_bytes());

  ExternalBuffers external;
  std::unique_ptr<ZeroOptimizer> opt = build_optimizer(comm, o, config, model.tensors, external);

  // Stage 2: the gradients reach the owners through a reduce round before every step (untimed).
  std::vector<float> grad_scratch;
  const auto prepare = [&] {
    if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
  };
  const double step_s = time_collectively(*comm, o.warmup, o.iters, [&] { opt->step(); }, prepare);
  const shardopt::MemoryReport memory = opt->memory_report();
  // Read now: the high-water mark of the optimizer alone, before STREAM's arrays and the
  // reference exist.
  const int64_t peak_rss = max_int64(*comm, peak_rss_bytes());

  // Bytes the step must move (see the top of the file), summed over the ranks.
  const std::vector<int64_t> shards = gather_int64(*comm, memory.shard_numel);
  int64_t all_shards = 0;
  for (int64_t s : shards) all_shards += s;
  const UpdateShape shape = update_shape(o);
  const int64_t per_param = update_bytes_per_param(shape, o.dtype);
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  // Elements this rank updates: its shard less the flat partition's tail padding, which no
  // kernel touches (sorted_greedy and replicated shards have none).
  int64_t my_offset = 0;
  for (int r = 0; r < rank; ++r) my_offset += shards[static_cast<std::size_t>(r)];
  const int64_t my_updated =
      o.sharded && o.partition == PartitionStrategy::flat
          ? std::clamp<int64_t>(memory.trainable_numel - my_offset, 0, memory.shard_numel)
          : memory.shard_numel;
  // The all-gather moves the padding too, so received elements include it.
  const int64_t my_received = sharded ? all_shards - memory.shard_numel : 0;
  const int64_t update_bytes = sum_int64(*comm, my_updated * per_param);
  // Each received element read once and written once, in the dtype.
  const int64_t sync_bytes = sum_int64(*comm, 2 * element_bytes * my_received);
  const int64_t total_bytes = update_bytes + sync_bytes;
  const int64_t max_state = max_int64(*comm, memory.state_bytes);
  const int64_t max_master = max_int64(*comm, memory.master_bytes);
  const int64_t max_grad = max_int64(*comm, memory.grad_bytes);

  // The roofline: the update's bytes at the bandwidth of its own access pattern, the sync's
  // bytes at copy bandwidth (both summed over ranks, measured with every rank streaming).
  const StreamResult stream = measure_stream(*comm, o.threads, o.stream_mb, shape, o.dtype);
  auto roofline_seconds = [&](int64_t update, int64_t sync) {
    return static_cast<double>(update) / (stream.update_gbps * 1e9) +
           static_cast<double>(sync) / (stream.copy_gbps * 1e9);
  };
  auto gbps = [](int64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0; };
  auto fraction = [](double roofline_s, double s) { return s > 0 ? roofline_s / s : 0.0; };
  const double roofline_s = roofline_seconds(update_bytes, sync_bytes);

  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    uint64_t hash = 0xCBF29CE484222325ull;
    for (int id = 0; id < opt->num_params(); ++id) {
      const TensorRef p = opt->param_view(id);
      hash = fnv1a(p.data, p.nbytes(), hash);
    }
    const std::vector<int64_t> hashes = gather_int64(*comm, static_cast<int64_t>(hash));
    int64_t differing_ranks = 0;
    for (int64_t h : hashes) differing_ranks += h != hashes[0] ? 1 : 0;
    // Every rank gets its own single-rank communicator for the reference.
    std::shared_ptr<Communicator> solo = comm->split(rank, 0);
    const int64_t mine = wrong_vs_reference(solo, o, model, *opt, rank, world, o.warmup + o.iters);
    wrong_total = differing_ranks + sum_int64(*comm, mine);
    wrong = std::to_string(wrong_total);
  }

  const char* mode = o.sharded ? "sharded" : "replicated";
  say(*comm,
      "world={} params={} {} optimizer={} partition={} dtype={} stage={} storage={} threads={} bucket_bytes={} pipeline_chunk_bytes={} mode={} "
      "iters={} warmup={} shard_numel_max={} state_bytes_per_rank={} master_bytes_per_rank={} "
      "grad_bytes_per_rank={} peak_rss_mb={:.1f} base_rss_mb={:.1f} "
      "update_bytes={} sync_bytes={} stream_copy_gbps={:.2f} stream_triad_gbps={:.2f} "
      "stream_update_gbps={:.2f} stream_array_mb={} roofline_ms={:.3f} "
      "step_ms_median={:.3f} params_per_s={:.4g} achieved_gbps={:.2f} roofline_fraction={:.3f} wrong={}\n",
      world, model.numel, model.description, shardopt::algorithm_name(o.algorithm),
      shardopt::partition_name(o.partition), shardopt::dtype_name(o.dtype), config.stage,
      o.storage == Storage::bucket_view ? "bucket_view" : "external",
      effective_threads(o.threads), o.bucket_bytes, o.pipeline_chunk_bytes, mode, o.iters, o.warmup, *std::max_element(shards.begin(), shards.end()),
      max_state, max_master, max_grad, static_cast<double>(peak_rss) / (1 << 20), static_cast<double>(base_rss) / (1 << 20), update_bytes, sync_bytes, stream.copy_gbps,
      stream.triad_gbps, stream.update_gbps, stream.array_bytes >> 20, roofline_s * 1e3, step_s * 1e3,
      step_s > 0 ? static_cast<double>(model.numel) / step_s : 0.0, gbps(total_bytes, step_s),
      fraction(roofline_s, step_s), wrong);

  if (o.breakdown) {
    // The update alone: a single-rank optimizer over as many elements as this rank's shard,
    // every rank at once (they share the memory bus as in the real step).
    std::shared_ptr<Communicator> solo = comm->split(rank, 0);
    OptimizerConfig update_config = config;
    update_config.storage = Storage::bucket_view;
    update_config.partition = PartitionStrategy::flat;
    update_config.shard_state = true;
    update_config.stage = 1;  // gradients written in place; the update itself is the same
    ExternalBuffers unused;
    std::unique_ptr<ZeroOptimizer> update_only;
    if (my_updated > 0) update_only = build_optimizer(solo, o, update_config, model_slice(model, 0, my_updated), unused);
    const double update_s = time_collectively(*comm, o.warmup, o.iters, [&] {
      if (update_only) update_only->step();
    });
    update_only.reset();

    // The sync alone, issued as the optimizer issues it.
    double sync_s = 0;
    if (sharded) {
      // Parameters in the dtype (bf16/f16: the 16-bit params, as the optimizer gathers them).
      std::vector<char> buffer(static_cast<std::size_t>(all_shards * element_bytes), 0);
      const auto at = [&](int64_t element) { return buffer.data() + element * element_bytes; };
      std::vector<int64_t> shard_offset(shards.size(), 0);
      for (std::size_t r = 1; r < shards.size(); ++r) shard_offset[r] = shard_offset[r - 1] + shards[r - 1];
      const int64_t bucket = config.bucket_bytes / element_bytes;
      sync_s = time_collectively(*comm, o.warmup, o.iters, [&] {
        if (o.partition == PartitionStrategy::flat) {
          const int64_t c = memory.shard_numel;
          comm->all_gather(at(static_cast<int64_t>(rank) * c), buffer.data(), c, o.dtype);
          return;
        }
        std::vector<std::unique_ptr<shardopt::PendingCollective>> pending;
        for (int r = 0; r < world; ++r) {
          const auto ru = static_cast<std::size_t>(r);
          for (int64_t begin = 0; begin < shards[ru]; begin += bucket) {
            pending.push_back(comm->broadcast_async(at(shard_offset[ru] + begin),
                                                    std::min(bucket, shards[ru] - begin), o.dtype, r));
          }
        }
        for (auto& p : pending) p->wait();
      });
    }
    // The gradient average before a step (not part of step_ms): reduce_gradients() over the
    // same synthetic gradients, whose coarse values average to themselves. Stage 2 hands them.
    const double reduce_s = time_collectively(*comm, o.warmup, o.iters, [&] {
      if (config.stage == 2) hand_gradients(*opt, o, model.tensors, grad_scratch);
      else opt->reduce_gradients();
    });
    say(*comm,
        "breakdown: update_ms_median={:.3f} update_gbps={:.2f} update_roofline_fraction={:.3f} "
        "sync_ms_median={:.3f} sync_gbps={:.2f} sync_roofline_fraction={:.3f} rest_ms={:.3f} "
        "reduce_gradients_ms_median={:.3f}\n",
        update_s * 1e3, gbps(update_bytes, update_s), fraction(roofline_seconds(update_bytes, 0), update_s),
        sync_s * 1e3, gbps(sync_bytes, sync_s), fraction(roofline_seconds(0, sync_bytes), sync_s),
        (step_s - update_s - sync_s) * 1e3, reduce_s * 1e3);
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::shared_ptr<Communicator> comm;
  try {
    comm = shardopt::mpi_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-bench: error: %s\n", e.what());
    return 1;
  }
  const bool leader = comm->rank() == 0;
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    // Every rank parsed the same arguments and fails the same way; one of them says so.
    if (leader) std::fprintf(stderr, "shardopt-bench: error: %s\n\n%s", e.what(), usage_text);
    return 2;
  }
  if (options.help) {
    if (leader) std::fputs(usage_text, stdout);
    return 0;
  }
  try {
    return options.mode == BenchMode::collectives ? run_collectives(*comm, options) : run_step(comm, options);
  } catch (const std::invalid_argument& e) {
    if (leader) std::fprintf(stderr, "shardopt-bench: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-bench: error on rank %d: %s\n", comm->rank(), e.what());
    return 1;
  }
}
