// tools/demo/options.cpp — parsing shardopt-demo's command line into Options, and its --help text.
#include "options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace shardopt_demo {

using shardopt::DType;

const char* const usage_text =
    "usage: mpirun -np N shardopt-demo [options]\n"
    "\n"
    "Trains an MLP of --layers Linear(width, width) layers (ReLU between them, MSE loss against\n"
    "random targets, each rank its own batch) with shardopt, once with the optimizer state\n"
    "sharded over the ranks and once replicated, and compares the resulting parameters.\n"
    "\n"
    "  --mode sharded|replicated|both      which runs to do (default both)\n"
    "  --partition flat|sorted_greedy      how the state is split over ranks (default flat)\n"
    "  --optimizer sgd|adam|adamw|muon     update rule, torch's defaults (default adam; muon: Muon\n"
    "                                      for the Linear weights, AdamW for the biases)\n"
    "  --lr X                              learning rate (default 0.01)\n"
    "  --dtype f32|bf16|f16                parameter and gradient type (default f32). bf16/f16:\n"
    "                                      shardopt keeps fp32 masters of each rank's shard; the\n"
    "                                      forward/backward runs in f32 on widened copies and\n"
    "                                      the gradients are narrowed for the optimizer. f16\n"
    "                                      uses dynamic loss scaling (steps whose gradients\n"
    "                                      overflow are skipped; --verbose shows them)\n"
    "  --master fp32|remainder16           bf16 masters as an fp32 copy (default) or as the\n"
    "                                      parameter and a 16-bit remainder (2 bytes per element)\n"
    "  --state-precision fp32|q8           Adam's moments in fp32 (default) or 8 bits per element\n"
    "                                      (bitsandbytes' blockwise quantisation; needs\n"
    "                                      --partition sorted_greedy; layers under 4096 elements\n"
    "                                      keep fp32 moments)\n"
    "  --stage 1|2                         ZeRO stage of the sharded run (default 1). 2: each\n"
    "                                      rank keeps only its shard's gradients; the backward\n"
    "                                      hands every layer's gradients with reduce_gradient()\n"
    "                                      as soon as they exist. The replicated run is stage 1\n"
    "  --clip MAX_NORM                     clip the averaged gradients to this total 2-norm\n"
    "                                      with clip_grad_norm() (default 0: off)\n"
    "  --layers N                          Linear layers (default 20)\n"
    "  --width N                           features per layer (default 2000)\n"
    "  --batch N                           samples per rank per step (default 20)\n"
    "  --steps N                           optimizer steps per mode (default 5)\n"
    "  --uneven                            uneven inputs: rank r trains --steps + r batches,\n"
    "                                      then calls join() (it takes its part in the others'\n"
    "                                      steps with zero gradients); the average divides by\n"
    "                                      the ranks still training. step_ms_median is then\n"
    "                                      timed without the barriers around each step\n"
    "  --overlap after-backward|per-bucket after the usual runs, run the first mode again with\n"
    "                                      the step overlapped: backward hands each layer's\n"
    "                                      gradients over as they exist (grad_ready at stage 1,\n"
    "                                      reduce_gradient at stage 2), the next forward waits\n"
    "                                      per layer (wait_param). after-backward: update after\n"
    "                                      backward, all-gathers overlap the next forward;\n"
    "                                      per-bucket: each bucket updated as its reduction\n"
    "                                      lands (no --clip, no f16 loss scaling). Bucket view\n"
    "                                      only; not with --local-sgd, --save or --resume\n"
    "  --seed N                            seed of the parameters and data (default 0)\n"
    "  --storage bucket_view|external      who owns the param/grad buffers (default bucket_view)\n"
    "  --threads N                         OpenBLAS and optimizer threads per rank (default 1)\n"
    "  --save DIR                          after the steps, save a sharded checkpoint of each\n"
    "                                      mode into DIR/sharded and DIR/replicated (and\n"
    "                                      DIR/local_sgd)\n"
    "  --resume DIR                        before the steps, load the checkpoint of each mode\n"
    "                                      from DIR/<mode> (any world size wrote it)\n"
    "  --local-sgd SPEC                    after the usual runs, train with PostLocalSGDOptimizer\n"
    "                                      and compare the bytes each rank communicates per step\n"
    "                                      and the final loss with the synchronous run. SPEC:\n"
    "                                      period=P,warmup=W[,hier=P1:G1:P2:G2...]\n"
    "                                      [,outer=LR:MOMENTUM][,replica=N]: average the\n"
    "                                      parameters every P steps after W warmup steps (torch's\n"
    "                                      PeriodicModelAverager); hier: levels of period:group\n"
    "                                      size in world ranks, the last one the world (torch's\n"
    "                                      HierarchicalModelAverager; period= may be left out,\n"
    "                                      or must equal the last level's); outer: the world\n"
    "                                      level applies SGD (Nesterov when MOMENTUM > 0) to the\n"
    "                                      replicas' average change (DiLoCo); replica: ranks per\n"
    "                                      replica, which share one sharded optimizer (default\n"
    "                                      1: every rank its own replica, classic local SGD)\n"
    "  --verbose                           also print every step's loss (with f16 the loss\n"
    "                                      scale and whether the step was skipped, with --clip\n"
    "                                      the gradient norm) and the memory report\n"
    "  --check-gradients                   compare the backward pass with finite differences\n"
    "                                      and exit (sizes default to --layers 3 --width 16\n"
    "                                      --batch 4 here)\n"
    "  --help                              this text\n"
    "\n"
    "Output (rank 0), one line per mode, then params_sum_match=yes|no when both modes ran:\n"
    "  mode=M world=N params=P dtype=D stage=S state_bytes=B grad_bytes=G peak_rss_mb=R\n"
    "  step_ms_median=T params_sum=S   (one line)\n"
    "state_bytes: what the optimizer keeps on rank 0 beyond parameters and gradients (its state\n"
    "plus the fp32 masters of bf16/f16 params); grad_bytes: the gradient memory shardopt owns on\n"
    "rank 0 (stage 2: its shard only); step_ms_median: step() alone; params_sum: the sum of all\n"
    "parameters (bf16/f16 widened to f32) in double.\n"
    "With --local-sgd, three more lines follow (see the README):\n"
    "  sync: mode=M steps=S bytes=B bytes_per_step=X final_loss=L\n"
    "  local_sgd: spec=SPEC replicas=R steps=S averages=A gradient_bytes=G averaging_bytes=V\n"
    "    replica_bytes=Q bytes=B bytes_per_step=X cross_replica_bytes=C final_loss=L\n"
    "    step_ms_median=T   (one line)\n"
    "  bytes_ratio=X (sync/local_sgd, per step)\n"
    "bytes: the payload this rank handed to collectives of more than one rank during the steps\n"
    "(its own contribution: a broadcast counts on its root only); local SGD: gradient_bytes +\n"
    "averaging_bytes from PostLocalSGDOptimizer::communication() plus replica_bytes, what the\n"
    "replica's optimizer hands to collectives outside the gradient calls (parameter sync);\n"
    "cross_replica_bytes: the part of bytes that crossed replicas (all of it with replica=1);\n"
    "final_loss: the last step's loss, the mean over all ranks.\n"
    "With --overlap, two more lines follow:\n"
    "  mode=M_overlap ... (as above)\n"
    "  overlap: policy=P visible_ms_median plain=X overlap=Y ratio=Z iter_ms_median plain=X\n"
    "    overlap=Y ratio=Z params_sum_match=yes|no   (one line)\n"
    "visible_ms: per iteration, the time spent inside shardopt calls (gradient hand-over,\n"
    "reduce_gradients, clip_grad_norm, step, wait_param); iter_ms: forward/backward plus those\n"
    "calls (not the demo's barriers); medians over the steps, ratio overlap/plain.\n";

namespace {

int64_t parse_integer(const std::string& option, const std::string& text, int64_t min_value,
                      int64_t max_value) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min_value || value > max_value) {
    throw UsageError(option + " expects an integer in [" + std::to_string(min_value) + ", " +
                     std::to_string(max_value) + "], got '" + text + "'");
  }
  return value;
}

double parse_positive_real(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value) || value <= 0.0) {
    throw UsageError(option + " expects a positive number, got '" + text + "'");
  }
  return value;
}

double parse_nonnegative_real(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value) || value < 0.0) {
    throw UsageError(option + " expects a number >= 0, got '" + text + "'");
  }
  return value;
}

[[noreturn]] void bad_choice(const std::string& option, const std::string& value,
                             const char* choices) {
  throw UsageError(option + " expects one of " + choices + ", got '" + value + "'");
}

// "a:b:c" -> {"a", "b", "c"}; empty pieces stay (and are refused by the number parsers).
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = text.find(separator, begin);
    pieces.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return pieces;
    begin = end + 1;
  }
}

}  // namespace

LocalSgdOptions parse_local_sgd(const std::string& spec) {
  const std::string where = "--local-sgd '" + spec + "': ";
  LocalSgdOptions local;
  local.enabled = true;
  local.spec = spec;
  std::set<std::string> seen;
  for (const std::string& item : split(spec, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError(where + "expected key=value items separated by commas, got '" + item + "'");
    }
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    if (!seen.insert(key).second) throw UsageError(where + key + "= given twice");
    const std::string name = where + key + "=";
    if (key == "period") {
      local.period = parse_integer(name, value, 1, 1000000);
    } else if (key == "warmup") {
      local.warmup = parse_integer(name, value, 0, 1000000);
    } else if (key == "replica") {
      local.replica = static_cast<int>(parse_integer(name, value, 1, 1 << 20));
    } else if (key == "hier") {
      const std::vector<std::string> numbers = split(value, ':');
      if (numbers.size() % 2 != 0) {
        throw UsageError(name + " expects period:group_size pairs (P1:G1:P2:G2...), got " +
                         std::to_string(numbers.size()) + " numbers in '" + value + "'");
      }
      for (std::size_t i = 0; i < numbers.size(); i += 2) {
        shardopt::AveragingLevel level;
        level.period = parse_integer(name + " period", numbers[i], 1, 1000000);
        level.group_size = static_cast<int>(parse_integer(name + " group size", numbers[i + 1], 1, 1 << 20));
        local.levels.push_back(level);
      }
    } else if (key == "outer") {
      const std::vector<std::string> numbers = split(value, ':');
      if (numbers.size() != 2) throw UsageError(name + " expects LR:MOMENTUM, got '" + value + "'");
      local.outer = true;
      local.outer_lr = parse_positive_real(name + " lr", numbers[0]);
      local.outer_momentum = parse_nonnegative_real(name + " momentum", numbers[1]);
      if (local.outer_momentum >= 1.0) {
        throw UsageError(name + " momentum expects a number in [0, 1), got '" + numbers[1] + "'");
      }
    } else {
      throw UsageError(where + "unknown key '" + key + "' (expected period, warmup, hier, outer, replica)");
    }
  }
  if (local.levels.empty() && local.period == 0) throw UsageError(where + "needs period=P (or hier=...)");
  // The world level is the one `period` names; two different answers would be ambiguous.
  if (!local.levels.empty() && local.period != 0 && local.period != local.levels.back().period) {
    throw UsageError(where + "period=" + std::to_string(local.period) +
                     " differs from the last hier= level's period " + std::to_string(local.levels.back().period));
  }
  return local;
}

shardopt::AveragerConfig averager_config(const LocalSgdOptions& local) {
  shardopt::AveragerConfig config = local.levels.empty()
                                        ? shardopt::periodic_averager(local.period, local.warmup)
                                        : shardopt::hierarchical_averager(local.levels, local.warmup);
  config.outer.enabled = local.outer;
  if (local.outer) {
    config.outer.lr = local.outer_lr;
    config.outer.momentum = local.outer_momentum;
    // DiLoCo's Nesterov momentum; torch's SGD refuses Nesterov without momentum, so momentum 0
    // is plain SGD on the pseudo-gradient (lr 1 then is plain averaging).
    config.outer.nesterov = local.outer_momentum > 0.0;
  }
  return config;
}

Options parse_options(int argc, char** argv) {
  Options options;
  // Limits keep every BLAS dimension inside int and every size product inside int64.
  constexpr int64_t max_dim = 1 << 20;
  for (int i = 1; i < argc; ++i) {
    std::string option = argv[i];
    std::string value;
    bool has_value = false;
    if (const auto eq = option.find('='); option.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = option.substr(eq + 1);
      option = option.substr(0, eq);
      has_value = true;
    }
    const auto flag = [&] {
      if (has_value) throw UsageError(option + " takes no value");
    };
    const auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw UsageError(option + " needs a value");
      return argv[++i];
    };
    if (option == "--help" || option == "-h") {
      flag();
      options.help = true;
    } else if (option == "--verbose") {
      flag();
      options.verbose = true;
    } else if (option == "--uneven") {
      flag();
      options.uneven = true;
    } else if (option == "--check-gradients") {
      flag();
      options.check_gradients = true;
    } else if (option == "--mode") {
      const std::string v = next();
      if (v == "both") options.modes = RunModes::both;
      else if (v == "sharded") options.modes = RunModes::sharded;
      else if (v == "replicated") options.modes = RunModes::replicated;
      else bad_choice(option, v, "sharded, replicated, both");
    } else if (option == "--partition") {
      const std::string v = next();
      if (v == "flat") options.partition = shardopt::PartitionStrategy::flat;
      else if (v == "sorted_greedy") options.partition = shardopt::PartitionStrategy::sorted_greedy;
      else bad_choice(option, v, "flat, sorted_greedy");
    } else if (option == "--optimizer") {
      const std::string v = next();
      if (v == "sgd") options.algorithm = shardopt::Algorithm::sgd;
      else if (v == "adam") options.algorithm = shardopt::Algorithm::adam;
      else if (v == "adamw") options.algorithm = shardopt::Algorithm::adamw;
      else if (v == "muon") options.algorithm = shardopt::Algorithm::muon;  // Muon weights, AdamW biases
      else bad_choice(option, v, "sgd, adam, adamw, muon");
    } else if (option == "--storage") {
      const std::string v = next();
      if (v == "bucket_view") options.storage = shardopt::Storage::bucket_view;
      else if (v == "external") options.storage = shardopt::Storage::external;
      else bad_choice(option, v, "bucket_view, external");
    } else if (option == "--dtype") {
      const std::string v = next();
      if (v == "f32") options.dtype = DType::f32;
      else if (v == "bf16") options.dtype = DType::bf16;
      else if (v == "f16") options.dtype = DType::f16;
      else bad_choice(option, v, "f32, bf16, f16");
    } else if (option == "--master") {
      const std::string v = next();
      if (v == "fp32") options.master = shardopt::MasterStorage::fp32;
      else if (v == "remainder16") options.master = shardopt::MasterStorage::remainder16;
      else bad_choice(option, v, "fp32, remainder16");
    } else if (option == "--state-precision") {
      const std::string v = next();
      if (v == "fp32") options.state_precision = shardopt::StatePrecision::fp32;
      else if (v == "q8") options.state_precision = shardopt::StatePrecision::q8;
      else bad_choice(option, v, "fp32, q8");
    } else if (option == "--stage") {
      options.stage = static_cast<int>(parse_integer(option, next(), 1, 2));
    } else if (option == "--clip") {
      options.clip = parse_nonnegative_real(option, next());
    } else if (option == "--lr") {
      options.lr = parse_positive_real(option, next());
    } else if (option == "--layers") {
      options.layers = static_cast<int>(parse_integer(option, next(), 1, 100000));
      options.layers_given = true;
    } else if (option == "--width") {
      options.width = static_cast<int>(parse_integer(option, next(), 1, max_dim));
      options.width_given = true;
    } else if (option == "--batch") {
      options.batch = static_cast<int>(parse_integer(option, next(), 1, max_dim));
      options.batch_given = true;
    } else if (option == "--steps") {
      options.steps = static_cast<int>(parse_integer(option, next(), 1, 1000000));
    } else if (option == "--overlap") {
      const std::string v = next();
      if (v == "after-backward") options.overlap = shardopt::OverlapPolicy::after_backward;
      else if (v == "per-bucket") options.overlap = shardopt::OverlapPolicy::per_bucket;
      else bad_choice(option, v, "after-backward, per-bucket");
    } else if (option == "--seed") {
      options.seed = static_cast<uint64_t>(
          parse_integer(option, next(), 0, std::numeric_limits<int64_t>::max()));
    } else if (option == "--save") {
      options.save_dir = next();
    } else if (option == "--resume") {
      options.resume_dir = next();
    } else if (option == "--local-sgd") {
      options.local_sgd = parse_local_sgd(next());
    } else if (option == "--threads") {
      options.threads = static_cast<int>(parse_integer(option, next(), 1, 1024));
    } else {
      throw UsageError("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  if (options.uneven && options.local_sgd.enabled) {
    throw UsageError("--uneven does not apply to --local-sgd (PostLocalSGDOptimizer has no join())");
  }
  if (options.overlap != shardopt::OverlapPolicy::off) {
    const bool per_bucket = options.overlap == shardopt::OverlapPolicy::per_bucket;
    const std::string name = std::string("--overlap ") + (per_bucket ? "per-bucket" : "after-backward");
    // Each refusal is one the optimizer would raise at run time, or a demo feature that would
    // race the optimizer's queued collectives; saying so up front beats a failure mid-run.
    if (per_bucket && options.clip > 0.0) {
      throw UsageError(name + " cannot clip (--clip): each bucket is updated before the total norm "
                              "exists; use --overlap after-backward");
    }
    if (per_bucket && options.dtype == DType::f16) {
      throw UsageError(name + " cannot use loss scaling, which --dtype f16 needs; use --overlap "
                              "after-backward or --dtype f32|bf16");
    }
    if (options.storage == shardopt::Storage::external) {
      throw UsageError(name + " needs --storage bucket_view (the optimizer's own buffers)");
    }
    if (options.local_sgd.enabled) {
      throw UsageError(name + " does not apply to --local-sgd (its averager shares the communicator)");
    }
    if (!options.save_dir.empty() || !options.resume_dir.empty()) {
      throw UsageError(name + " does not combine with --save/--resume");
    }
    if (options.check_gradients) throw UsageError(name + " does not apply to --check-gradients");
  }
  if (options.check_gradients) {
    if (!options.layers_given) options.layers = 3;
    if (!options.width_given) options.width = 16;
    if (!options.batch_given) options.batch = 4;
  }
  return options;
}

}  // namespace shardopt_demo
