// bench/src/options.cpp — parses shardopt-bench's flags (nccl-tests' sweep names plus the step's own) into Options.
#include "options.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include <fmt/format.h>

namespace shardopt_bench {

const char* const usage_text =
    "usage: mpirun -np N shardopt-bench [--mode collectives|step|iteration|checkpoint] [--device cpu|cuda] [options]\n"
    "\n"
    "Device options (collectives and step):\n"
    "  --device cpu|cuda         where the buffers and parameters live (default cpu). cuda: one\n"
    "                            GPU per rank (node-local rank % devices), device buffers from\n"
    "                            cudaMalloc, timed with a device synchronisation around each\n"
    "                            call; the step's roofline is the device-to-device bandwidth\n"
    "                            measured in the same run. Exit status 4 when this build or\n"
    "                            machine cannot run it (no CUDA, no device, no NCCL)\n"
    "  --comm nccl|mpi           with --device cuda: the communicator under test (default\n"
    "                            nccl, bootstrapped over MPI; mpi needs one rank or a\n"
    "                            CUDA-aware MPI)\n"
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
    "  --optimizer sgd|adam|adamw|muon       (default adam; sgd uses --momentum; also\n"
    "                                        --algorithm). muon: --mode step only, the\n"
    "                                        --layers x --width model with the weights in a\n"
    "                                        Muon group and the biases in an AdamW one; prints\n"
    "                                        the Newton-Schulz time beside the update and sync\n"
    "                                        (--device cuda: cuBLAS, checked against the CPU)\n"
    "  --muon-precision bf16|f32             Muon's Newton-Schulz products (default bf16)\n"
    "  --blas-threads T                      OpenBLAS threads per orthogonalisation (default 1)\n"
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
    "  --stage2-grads views|hand-over        stage 2 with bucket view: write the gradients\n"
    "                                        through grad_view() where it exists (one node,\n"
    "                                        node-shared slots; default views), or hand each\n"
    "                                        with reduce_gradient() (a copy into the slot)\n"
    "  --threads T               OpenMP threads per rank, for the update and STREAM (default 1;\n"
    "                            --device cuda: the CPU reference's threads, default all cores)\n"
    "  --bucket-bytes B          OptimizerConfig::bucket_bytes (default 4 MiB, the library default)\n"
    "  --pipeline-chunk-bytes B  OptimizerConfig::pipeline_chunk_bytes: update and sync in chunks (default 0: off)\n"
    "  --node-shared 0|1         OptimizerConfig::node_shared_params (default 1): 0 makes the\n"
    "                            sync copy every shard between ranks, as across nodes\n"
    "  --mode sharded|replicated state sharded (default) or replicated, the unsharded\n"
    "                            baseline; implies --mode step (also --shard ...)\n"
    "  --stream-mb M             MiB per bandwidth-test array, 4 arrays per rank (default\n"
    "                            max(4 x the last-level caches this rank's CPUs use, 64),\n"
    "                            the cache read from sysfs; --device cuda: max(8 x L2, 512))\n"
    "  --breakdown               also print the step's phases (agreement, update, sync and\n"
    "                            the rest), medians over the same timed steps, and time\n"
    "                            reduce_gradients() on its own\n"
    "\n"
    "Iteration (--mode iteration: the step options pick the model; -n iterations): each\n"
    "iteration is a bandwidth probe, reduce_gradients() (stage 2: every gradient handed with\n"
    "reduce_gradient() first) and step(), each timed between barriers; one line with both\n"
    "times, their rooflines (best probe, and each iteration against its own probe) and the\n"
    "probes' spread\n"
    "  --overlap off|after_backward|per_bucket   OptimizerConfig::overlap (default off); the\n"
    "                            gradients are marked with grad_ready() in backward order\n"
    "  --backward copy|none      copy: the timed reduce starts with a stand-in backward that\n"
    "                            writes every gradient into grad_view in backward order (from\n"
    "                            values made once; grad_ready after each under --overlap), so\n"
    "                            overlap has work to run beside (default none)\n"
    "\n"
    "Checkpoint options (--mode checkpoint: the step options pick the model; -n rounds):\n"
    "  --ckpt-dir DIR            where every rank saves, shared by the ranks\n"
    "                            (default shardopt-bench-ckpt)\n"
    "  --save-every N            steps per round: no save, save(), save_async() (default 5)\n"
    "\n"
    "Output (rank 0): collectives print a table per op and '# Wrong values total : N OK|FAILED';\n"
    "step prints one line of key=value pairs (inputs such as dtype=... stage=..., memory such\n"
    "as state_bytes_per_rank (optimizer state), master_bytes_per_rank (fp32 masters) and\n"
    "grad_bytes_per_rank, the largest rank's) ending in step_ms_median=... params_per_s=...\n"
    "achieved_gbps=... roofline_fraction=F roofline_status=S wrong=N. A fraction above 1.05\n"
    "of a DRAM-bound step is a measurement error, printed as such (S=measurement_error); a\n"
    "step whose data fit in the last-level cache is not judged (S=cache_resident).\n"
    "checkpoint prints one line: the median plain step, each kind of save's calls, and each\n"
    "kind's visible cost per round (its time beyond the plain steps) and their ratio.\n"
    "--device cuda step adds d2d_*_gbps (the bandwidths measured), gpu_event_ms_median and\n"
    "step_over_roofline (step time / roofline time, the inverse of roofline_fraction).\n"
    "Exit status: 0 OK, 1 when anything was wrong, 2 for a bad option, 3 when the results\n"
    "were right but the roofline measurement was not (S=measurement_error), 4 when --device\n"
    "cuda cannot run here (one line says why).\n";

[[noreturn]] void bad_usage(const std::string& message) { throw std::invalid_argument(message); }

namespace {

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

}  // namespace

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
      else if (flag == "--mode" && value == "checkpoint") o.mode = BenchMode::checkpoint;
      else if (flag == "--mode" && value == "iteration") o.mode = BenchMode::iteration;
      else if (value == "sharded" || value == "replicated") {
        o.mode = BenchMode::step;
        o.sharded = value == "sharded";
      } else {
        bad_usage(flag + " expects collectives, step, iteration, checkpoint, sharded or replicated, got '" + value + "'");
      }
    } else if (flag == "--params") o.params = parse_size(flag, value);
    else if (flag == "--tensors") o.tensors = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--layers") o.layers = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--width") o.width = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--optimizer" || flag == "--algorithm") {
      if (value == "sgd") o.algorithm = Algorithm::sgd;
      else if (value == "adam") o.algorithm = Algorithm::adam;
      else if (value == "adamw") o.algorithm = Algorithm::adamw;
      else if (value == "muon") o.algorithm = Algorithm::muon;
      else bad_usage(flag + " expects sgd, adam, adamw or muon, got '" + value + "'");
    } else if (flag == "--muon-precision") {
      if (value == "bf16") o.muon_precision = shardopt::MatrixPrecision::bf16;
      else if (value == "f32") o.muon_precision = shardopt::MatrixPrecision::f32;
      else bad_usage("--muon-precision expects bf16 or f32, got '" + value + "'");
    } else if (flag == "--blas-threads") {
      o.blas_threads = static_cast<int>(parse_int(flag, value, 1, 1024));
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
    else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_int(flag, value, 0, 1024));
      o.threads_given = true;
    } else if (flag == "--device") {
      if (value == "cpu") o.device = BenchDevice::cpu;
      else if (value == "cuda") o.device = BenchDevice::cuda;
      else bad_usage("--device expects cpu or cuda, got '" + value + "'");
    } else if (flag == "--comm") {
      if (value == "nccl") o.comm = DeviceComm::nccl;
      else if (value == "mpi") o.comm = DeviceComm::mpi;
      else bad_usage("--comm expects nccl or mpi, got '" + value + "'");
      o.comm_given = true;
    }
    else if (flag == "--bucket-bytes") o.bucket_bytes = std::max<int64_t>(1, parse_size(flag, value));
    else if (flag == "--pipeline-chunk-bytes") o.pipeline_chunk_bytes = parse_size(flag, value);
    else if (flag == "--node-shared") o.node_shared_params = parse_int(flag, value, 0, 1) == 1;
    else if (flag == "--overlap") {
      if (value == "off") o.overlap = shardopt::OverlapPolicy::off;
      else if (value == "after_backward") o.overlap = shardopt::OverlapPolicy::after_backward;
      else if (value == "per_bucket") o.overlap = shardopt::OverlapPolicy::per_bucket;
      else bad_usage("--overlap expects off, after_backward or per_bucket, got '" + value + "'");
    } else if (flag == "--backward") {
      if (value == "copy") o.backward_copy = true;
      else if (value == "none") o.backward_copy = false;
      else bad_usage("--backward expects copy or none, got '" + value + "'");
    }
    else if (flag == "--stage2-grads") {
      if (value == "views") o.stage2_grad_views = true;
      else if (value == "hand-over") o.stage2_grad_views = false;
      else bad_usage("--stage2-grads expects views or hand-over, got '" + value + "'");
    }
    else if (flag == "--ckpt-dir") o.ckpt_dir = value;
    else if (flag == "--save-every") o.save_every = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
    else if (flag == "--stream-mb") o.stream_mb = parse_int(flag, value, 1, int64_t{1} << 20);
    else bad_usage("unknown option '" + flag + "'");
  }
  if (o.min_bytes > o.max_bytes) {
    bad_usage(fmt::format("-b ({}) is larger than -e ({})", o.min_bytes, o.max_bytes));
  }
  if ((o.overlap != shardopt::OverlapPolicy::off || o.backward_copy) && o.mode != BenchMode::iteration) {
    bad_usage("--overlap and --backward are options of --mode iteration");
  }
  if (o.stage == 2 && !o.sharded) {
    bad_usage("--stage 2 shards the gradients by the state's partition; it needs --mode sharded");
  }
  if (o.device == BenchDevice::cuda && (o.mode == BenchMode::checkpoint || o.mode == BenchMode::iteration)) {
    bad_usage("--device cuda runs the collectives and step modes, not --mode checkpoint or iteration");
  }
  if (o.device == BenchDevice::cuda && o.mode == BenchMode::step && o.stage == 2) {
    bad_usage("--device cuda times the stage-1 step only; drop --stage 2");
  }
  if (o.device == BenchDevice::cuda && o.breakdown) {
    bad_usage("--breakdown is not measured with --device cuda: the step's phases are only enqueued on the host");
  }
  if (o.comm_given && o.device != BenchDevice::cuda) {
    bad_usage("--comm picks the communicator of --device cuda; the cpu device always uses MPI");
  }
  if (o.algorithm == Algorithm::muon &&
      (o.mode != BenchMode::step || o.params > 0 || !o.sharded || o.storage != Storage::bucket_view)) {
    bad_usage("--algorithm muon runs --mode step over the --layers x --width model, sharded, with bucket_view storage");
  }
  if (o.step_factor <= 1.0 && o.step_bytes <= 0 && o.min_bytes != o.max_bytes) {
    bad_usage("-f must be > 1, or -i must be positive, for the sweep to advance");
  }
  return o;
}

}  // namespace shardopt_bench
