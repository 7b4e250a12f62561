// tools/shardopt_demo.cpp — PyTorch's ZeroRedundancyOptimizer tutorial in C++: an MLP trained sharded vs replicated.
//
// Every rank builds the same MLP (same seed), feeds it its own random batch, runs a real
// forward/backward with OpenBLAS, averages gradients with reduce_gradients() and steps. The
// run is done twice, with the optimizer state sharded (ZeRO-1, or ZeRO-2 with --stage 2) and
// replicated (plain data parallel, always stage 1), and rank 0 prints one line per mode: state
// and gradient bytes, peak RSS, the median step time and the sum of all parameters, which must
// be bitwise the same in both modes.
//
// --dtype bf16|f16 registers 16-bit parameters and gradients (shardopt keeps fp32 masters of
// the local shard). The forward/backward stays f32: the demo keeps f32 working copies of the
// parameters, widened from param_view() after every step (outside the timed region), computes
// each layer's gradients in f32 and, as a backward hook would, narrows them into grad_view()
// (stage 1) or hands them with reduce_gradient() (stage 2), layer by layer in backward order.
// f16 runs with dynamic loss scaling: the gradients are multiplied by loss_scale() before they
// are narrowed, and a step whose gradients overflowed is skipped.
#include <cblas.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "shardopt/shardopt.hpp"
#include "precision.hpp"  // kernels/: bf16/f16 <-> float, the library's own rounding

namespace {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

// ---- options --------------------------------------------------------------------------------

const char* const usage_text =
    "usage: mpirun -np N shardopt-demo [options]\n"
    "\n"
    "Trains an MLP of --layers Linear(width, width) layers (ReLU between them, MSE loss against\n"
    "random targets, each rank its own batch) with shardopt, once with the optimizer state\n"
    "sharded over the ranks and once replicated, and compares the resulting parameters.\n"
    "\n"
    "  --mode sharded|replicated|both      which runs to do (default both)\n"
    "  --partition flat|sorted_greedy      how the state is split over ranks (default flat)\n"
    "  --optimizer sgd|adam|adamw          update rule, torch's defaults (default adam)\n"
    "  --lr X                              learning rate (default 0.01)\n"
    "  --dtype f32|bf16|f16                parameter and gradient type (default f32). bf16/f16:\n"
    "                                      shardopt keeps fp32 masters of each rank's shard; the\n"
    "                                      forward/backward runs in f32 on widened copies and\n"
    "                                      the gradients are narrowed for the optimizer. f16\n"
    "                                      uses dynamic loss scaling (steps whose gradients\n"
    "                                      overflow are skipped; --verbose shows them)\n"
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
    "  --seed N                            seed of the parameters and data (default 0)\n"
    "  --storage bucket_view|external      who owns the param/grad buffers (default bucket_view)\n"
    "  --threads N                         OpenBLAS and optimizer threads per rank (default 1)\n"
    "  --save DIR                          after the steps, save a sharded checkpoint of each\n"
    "                                      mode into DIR/sharded and DIR/replicated\n"
    "  --resume DIR                        before the steps, load the checkpoint of each mode\n"
    "                                      from DIR/<mode> (any world size wrote it)\n"
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
    "parameters (bf16/f16 widened to f32) in double.\n";

enum class RunModes { both, sharded, replicated };

struct Options {
  RunModes modes = RunModes::both;
  shardopt::PartitionStrategy partition = shardopt::PartitionStrategy::flat;
  shardopt::Algorithm algorithm = shardopt::Algorithm::adam;
  shardopt::Storage storage = shardopt::Storage::bucket_view;
  DType dtype = DType::f32;
  int stage = 1;       // of the sharded run; the replicated run is always stage 1
  double clip = 0.0;   // max total gradient norm; 0: no clipping
  double lr = 0.01;
  int layers = 20;
  int width = 2000;
  int batch = 20;
  int steps = 5;
  uint64_t seed = 0;
  int threads = 1;
  bool verbose = false;
  bool check_gradients = false;
  std::string save_dir;    // empty: no checkpoint written
  std::string resume_dir;  // empty: start from the seeded initial values
  bool help = false;
  // Whether the size was given on the command line: --check-gradients picks tiny defaults.
  bool layers_given = false;
  bool width_given = false;
  bool batch_given = false;
};

// A bad command line: reported on rank 0 with the usage text, exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
      else bad_choice(option, v, "sgd, adam, adamw");
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
    } else if (option == "--seed") {
      options.seed = static_cast<uint64_t>(
          parse_integer(option, next(), 0, std::numeric_limits<int64_t>::max()));
    } else if (option == "--save") {
      options.save_dir = next();
    } else if (option == "--resume") {
      options.resume_dir = next();
    } else if (option == "--threads") {
      options.threads = static_cast<int>(parse_integer(option, next(), 1, 1024));
    } else {
      throw UsageError("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  if (options.check_gradients) {
    if (!options.layers_given) options.layers = 3;
    if (!options.width_given) options.width = 16;
    if (!options.batch_given) options.batch = 4;
  }
  return options;
}

// ---- deterministic random numbers -----------------------------------------------------------

// splitmix64: tiny, fast, and the same on every platform, so every rank (and both modes)
// draws exactly the same parameters from the same seed without any communication.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One independent stream per (seed, what, index...) so that the parameters do not depend on
// the order or number of draws made for anything else.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t domain, uint64_t a = 0, uint64_t b = 0) : state_(seed) {
    for (const uint64_t word : {domain, a, b}) {
      state_ ^= word;
      state_ = splitmix64(state_);
    }
  }
  // Uniform in [0, 1) with 24 random bits: exactly representable as a float.
  double uniform() { return static_cast<double>(splitmix64(state_) >> 40) * 0x1.0p-24; }
  // Standard normal (Box-Muller), the demo's torch.randn.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

enum StreamDomain : uint64_t { weight_stream = 1, bias_stream = 2, input_stream = 3, target_stream = 4 };

// nn.Linear's default initialisation: weight and bias uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void init_linear(uint64_t seed, int layer, int fan_in, float* weight, int64_t weight_numel,
                 float* bias, int64_t bias_numel) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Stream w(seed, weight_stream, static_cast<uint64_t>(layer));
  for (int64_t i = 0; i < weight_numel; ++i) weight[i] = static_cast<float>((2.0 * w.uniform() - 1.0) * bound);
  Stream b(seed, bias_stream, static_cast<uint64_t>(layer));
  for (int64_t i = 0; i < bias_numel; ++i) bias[i] = static_cast<float>((2.0 * b.uniform() - 1.0) * bound);
}

// This rank's batch: inputs and targets ~ N(0, 1), different on every rank. The same batch is
// used at every step, so the loss (--verbose) visibly goes down as the model fits it.
void make_batch(uint64_t seed, int rank, std::vector<float>& input, std::vector<float>& target) {
  Stream in(seed, input_stream, static_cast<uint64_t>(rank));
  for (float& x : input) x = static_cast<float>(in.normal());
  Stream tg(seed, target_stream, static_cast<uint64_t>(rank));
  for (float& y : target) y = static_cast<float>(tg.normal());
}

// ---- the MLP --------------------------------------------------------------------------------

// Where one Linear layer's tensors live right now (shardopt's bucket views or our buffers).
// Weights are [out x in] row-major, as torch stores them.
struct LinearTensors {
  float* weight = nullptr;
  float* bias = nullptr;
  float* weight_grad = nullptr;
  float* bias_grad = nullptr;
};

// Forward and backward of Linear -> ReLU -> ... -> Linear with an MSE loss, all layers
// width x width. Activations are kept per layer for the backward pass.
class Mlp {
 public:
  Mlp(int layers, int width, int batch)
      : layers_(layers), width_(width), batch_(batch),
        activations_(static_cast<std::size_t>(layers) + 1,
                     std::vector<float>(static_cast<std::size_t>(batch) * width)),
        grad_out_(static_cast<std::size_t>(batch) * width),
        grad_in_(static_cast<std::size_t>(batch) * width) {}

  // Returns the mean squared error of the output against `target` and overwrites (does not
  // accumulate into) every layer's weight_grad/bias_grad with d loss / d param. `layer_done`
  // (if set) is called with l as soon as layer l's gradients are complete, in backward order
  // (last layer first), like a backward hook; it may consume them and let the next layer
  // reuse the same gradient buffers.
  double forward_backward(const std::vector<LinearTensors>& net, const float* input,
                          const float* target, const std::function<void(int)>& layer_done = {}) {
    const int n = width_;
    const int b = batch_;
    const std::size_t elems = static_cast<std::size_t>(b) * n;
    std::copy(input, input + elems, activations_[0].begin());
    for (int l = 0; l < layers_; ++l) {
      const float* x = activations_[l].data();
      float* y = activations_[l + 1].data();
      // y = x W^T + bias: start from the bias in every row, then accumulate the product.
      for (int r = 0; r < b; ++r) std::copy(net[l].bias, net[l].bias + n, y + static_cast<std::size_t>(r) * n);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, n, n, 1.0f, x, n, net[l].weight, n,
                  1.0f, y, n);
      if (l + 1 < layers_) {
        for (std::size_t i = 0; i < elems; ++i) y[i] = std::max(y[i], 0.0f);
      }
    }

    // loss = mean((y - t)^2), so d loss / d y = 2 (y - t) / (batch * width).
    const float* out = activations_[layers_].data();
    const double scale = 2.0 / static_cast<double>(elems);
    double loss = 0.0;
    for (std::size_t i = 0; i < elems; ++i) {
      const double diff = static_cast<double>(out[i]) - static_cast<double>(target[i]);
      loss += diff * diff;
      grad_out_[i] = static_cast<float>(scale * diff);
    }
    loss /= static_cast<double>(elems);

    for (int l = layers_ - 1; l >= 0; --l) {
      const float* x = activations_[l].data();
      const float* dy = grad_out_.data();
      // dW = dY^T X   ([out x batch] . [batch x in])
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, b, 1.0f, dy, n, x, n, 0.0f,
                  net[l].weight_grad, n);
      // dbias = column sums of dY
      float* db = net[l].bias_grad;
      std::fill(db, db + n, 0.0f);
      for (int r = 0; r < b; ++r) {
        const float* row = dy + static_cast<std::size_t>(r) * n;
        for (int j = 0; j < n; ++j) db[j] += row[j];
      }
      if (layer_done) layer_done(l);
      if (l == 0) break;  // nobody needs the gradient of the input
      // dX = dY W   ([batch x out] . [out x in]), then through the previous ReLU: x > 0
      // exactly where its pre-activation was > 0.
      float* dx = grad_in_.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, n, n, 1.0f, dy, n, net[l].weight,
                  n, 0.0f, dx, n);
      for (std::size_t i = 0; i < elems; ++i) {
        if (!(x[i] > 0.0f)) dx[i] = 0.0f;
      }
      std::swap(grad_out_, grad_in_);
    }
    return loss;
  }

 private:
  int layers_;
  int width_;
  int batch_;
  std::vector<std::vector<float>> activations_;  // [0] input, [l+1] output of layer l
  std::vector<float> grad_out_;
  std::vector<float> grad_in_;
};

// The same network's loss in double with plain loops: an independent reference for the
// gradient check (it shares no code with the BLAS path).
double reference_loss(int layers, int width, int batch, const std::vector<std::vector<double>>& weights,
                      const std::vector<std::vector<double>>& biases, const std::vector<float>& input,
                      const std::vector<float>& target) {
  const std::size_t n = static_cast<std::size_t>(width);
  std::vector<double> x(input.begin(), input.end());
  std::vector<double> y(x.size());
  for (int l = 0; l < layers; ++l) {
    for (int r = 0; r < batch; ++r) {
      for (std::size_t o = 0; o < n; ++o) {
        double acc = biases[l][o];
        for (std::size_t i = 0; i < n; ++i) acc += x[r * n + i] * weights[l][o * n + i];
        y[r * n + o] = (l + 1 < layers) ? std::max(acc, 0.0) : acc;
      }
    }
    std::swap(x, y);
  }
  double loss = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double diff = x[i] - static_cast<double>(target[i]);
    loss += diff * diff;
  }
  return loss / static_cast<double>(x.size());
}

// ---- measurements ---------------------------------------------------------------------------

// Peak RSS is a per-process high-water mark that only grows. To give each mode its own number
// we hand freed memory back to the kernel between modes and reset the mark (Linux >= 4.0:
// writing "5" to /proc/self/clear_refs sets VmHWM to the current RSS). Returns false when the
// reset is not possible; the reported peak is then the process-lifetime peak (ru_maxrss).
bool reset_peak_rss() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ofstream clear_refs("/proc/self/clear_refs");
  if (!clear_refs) return false;
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;  // kB
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // kB on Linux
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// ---- one training run -----------------------------------------------------------------------

struct ModeResult {
  int64_t params = 0;
  int stage = 1;
  int64_t state_bytes = 0;  // optimizer state plus fp32 masters: all it keeps beyond params/grads
  int64_t grad_bytes = 0;   // gradient memory shardopt owns
  double peak_rss_mb = 0.0;
  double step_ms_median = 0.0;
  double params_sum = 0.0;
};

std::string layer_param_name(int layer, const char* kind) {
  return "layers." + std::to_string(layer) + "." + kind;
}

// bf16/f16 parameters -> the demo's f32 working copy, with the library's own conversions.
void widen(const TensorRef& src, float* dst) {
  const int64_t n = src.numel;
  if (src.dtype == DType::f32) {
    std::memcpy(dst, src.data, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* h = src.as<const uint16_t>();
  if (src.dtype == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::bf16_to_float(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::f16_to_float(h[i]);
  }
}

// f32 values times `scale` (the loss scale; 1 without scaling) -> bf16/f16, nearest even. A
// power-of-two scale is exact in f32; what does not fit the dtype becomes inf, which the
// optimizer's loss scaling detects.
void narrow(const float* src, int64_t n, float scale, DType dtype, uint16_t* dst) {
  if (dtype == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::float_to_bf16(src[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = shardopt::kernels::float_to_f16(src[i] * scale);
  }
}

ModeResult train(const std::shared_ptr<Communicator>& comm_ptr, const Options& options,
                 bool shard_state) {
  Communicator& comm = *comm_ptr;
  const int rank = comm.rank();
  const int64_t width = options.width;
  const int64_t weight_numel = width * width;
  const int64_t layer_numel = weight_numel + width;
  const int64_t total_numel = layer_numel * options.layers;
  const bool external = options.storage == shardopt::Storage::external;
  const DType dtype = options.dtype;
  const bool half = dtype != DType::f32;
  // Stage 2 shards gradients by the state's partition, so the replicated baseline is stage 1.
  const int stage = shard_state ? options.stage : 1;
  // Stage 2 with bucket view has no grad_view(): each gradient is handed with reduce_gradient().
  const bool hand_gradients = stage == 2 && !external;
  // f32 gradients that the optimizer reads from a buffer (grad_view(): its own at stage 1, our
  // external ones otherwise) are written there directly by the backward. Otherwise the backward
  // writes each layer into one f32 scratch that a per-layer hook narrows into grad_view() or
  // hands to reduce_gradient(), as a trainer's backward hooks would.
  const bool direct_grads = !half && !hand_gradients;

  // Initial values. bucket_view: one staging buffer that shardopt copies into its own flat
  // buffer at construction and that we free right after. external: these are the parameters
  // (and gradient buffers). 16-bit parameters are drawn in f32 and narrowed, nearest even.
  std::vector<float> staging32(!external && !half ? static_cast<std::size_t>(total_numel) : 0);
  std::vector<uint16_t> staging16(!external && half ? static_cast<std::size_t>(total_numel) : 0);
  std::vector<float> init_weight(half ? static_cast<std::size_t>(weight_numel) : 0);
  std::vector<float> init_bias(half ? static_cast<std::size_t>(width) : 0);
  std::vector<std::vector<float>> own_params32, own_grads32;
  std::vector<std::vector<uint16_t>> own_params16, own_grads16;

  shardopt::ParamGroupSpec group;
  group.hyper.lr = options.lr;
  // torch.optim.AdamW decays by 0.01 by default (Adam and SGD by 0); without it AdamW would
  // just be Adam again.
  if (options.algorithm == shardopt::Algorithm::adamw) group.hyper.weight_decay = 0.01;
  // bucket_view: `grad` is null (shardopt owns the gradients); external: our gradient buffer.
  const auto spec = [dtype](std::string name, void* param, void* grad, int64_t numel) {
    shardopt::ParamSpec p;
    p.name = std::move(name);
    p.param = TensorRef{param, numel, dtype, shardopt::Device::cpu()};
    p.grad = TensorRef{grad, numel, dtype, shardopt::Device::cpu()};
    return p;
  };
  for (int l = 0; l < options.layers; ++l) {
    void* weight = nullptr;
    void* bias = nullptr;
    void* weight_grad = nullptr;
    void* bias_grad = nullptr;
    if (!half) {
      float* w32 = nullptr;
      float* b32 = nullptr;
      if (external) {
        own_params32.emplace_back(static_cast<std::size_t>(weight_numel));
        w32 = own_params32.back().data();
        own_params32.emplace_back(static_cast<std::size_t>(width));
        b32 = own_params32.back().data();
        own_grads32.emplace_back(static_cast<std::size_t>(weight_numel));
        weight_grad = own_grads32.back().data();
        own_grads32.emplace_back(static_cast<std::size_t>(width));
        bias_grad = own_grads32.back().data();
      } else {
        w32 = staging32.data() + l * layer_numel;
        b32 = w32 + weight_numel;
      }
      init_linear(options.seed, l, options.width, w32, weight_numel, b32, width);
      weight = w32;
      bias = b32;
    } else {
      uint16_t* w16 = nullptr;
      uint16_t* b16 = nullptr;
      if (external) {
        own_params16.emplace_back(static_cast<std::size_t>(weight_numel));
        w16 = own_params16.back().data();
        own_params16.emplace_back(static_cast<std::size_t>(width));
        b16 = own_params16.back().data();
        own_grads16.emplace_back(static_cast<std::size_t>(weight_numel));
        weight_grad = own_grads16.back().data();
        own_grads16.emplace_back(static_cast<std::size_t>(width));
        bias_grad = own_grads16.back().data();
      } else {
        w16 = staging16.data() + l * layer_numel;
        b16 = w16 + weight_numel;
      }
      init_linear(options.seed, l, options.width, init_weight.data(), weight_numel, init_bias.data(), width);
      narrow(init_weight.data(), weight_numel, 1.0f, dtype, w16);
      narrow(init_bias.data(), width, 1.0f, dtype, b16);
      weight = w16;
      bias = b16;
    }
    group.params.push_back(spec(layer_param_name(l, "weight"), weight, weight_grad, weight_numel));
    group.params.push_back(spec(layer_param_name(l, "bias"), bias, bias_grad, width));
  }

  shardopt::OptimizerConfig config;
  config.algorithm = options.algorithm;
  config.partition = options.partition;
  config.storage = options.storage;
  config.shard_state = shard_state;
  config.stage = stage;
  config.cpu_threads = options.threads;
  // f16 gradients underflow without a loss scale (torch.cuda.amp.GradScaler's defaults).
  config.loss_scaling.enabled = dtype == DType::f16;
  std::vector<shardopt::ParamGroupSpec> groups;
  groups.push_back(std::move(group));
  ZeroOptimizer opt(comm_ptr, config, std::move(groups));
  std::vector<float>().swap(staging32);
  std::vector<uint16_t>().swap(staging16);
  std::vector<float>().swap(init_weight);
  std::vector<float>().swap(init_bias);

  // peak_rss_mb is this process's (rank 0's, as printed) high-water mark from here to the end
  // of the mode: parameters, gradients, optimizer state, activations, the f32 working copies
  // of 16-bit parameters and communication buffers (transient ones included), but neither the
  // initial-value staging just freed nor anything left over from the previous mode.
  const bool peak_is_per_mode = reset_peak_rss();
  if (!peak_is_per_mode && rank == 0) {
    std::fprintf(stderr, "shardopt-demo: note: cannot reset the peak RSS; peak_rss_mb is the "
                         "process-lifetime peak\n");
  }

  std::vector<shardopt::ParamId> weight_id(static_cast<std::size_t>(options.layers));
  std::vector<shardopt::ParamId> bias_id(weight_id.size());
  for (int l = 0; l < options.layers; ++l) {
    weight_id[l] = opt.find_param(layer_param_name(l, "weight"));
    bias_id[l] = opt.find_param(layer_param_name(l, "bias"));
  }
  // 16-bit parameters: the f32 copies the forward/backward reads, layer after layer.
  std::vector<float> work(half ? static_cast<std::size_t>(total_numel) : 0);
  // One layer's f32 gradients, consumed by the hook before the next layer overwrites them.
  std::vector<float> grad_scratch(direct_grads ? 0 : static_cast<std::size_t>(layer_numel));
  // Stage 2, 16-bit: the narrowed gradients handed to reduce_gradient() (read before it returns).
  std::vector<uint16_t> hand_scratch(hand_gradients && half ? static_cast<std::size_t>(layer_numel) : 0);

  // Views can move when the layout is rebuilt, so look them up again whenever it changes.
  std::vector<LinearTensors> net(static_cast<std::size_t>(options.layers));
  uint64_t seen_layout = 0;
  bool have_views = false;
  const auto refresh_views = [&] {
    if (have_views && opt.layout_version() == seen_layout) return;
    for (int l = 0; l < options.layers; ++l) {
      const shardopt::ParamId w = weight_id[l];
      const shardopt::ParamId b = bias_id[l];
      LinearTensors t;
      if (half) {
        t.weight = work.data() + l * layer_numel;
        t.bias = t.weight + weight_numel;
      } else {
        t.weight = opt.param_view(w).as<float>();
        t.bias = opt.param_view(b).as<float>();
      }
      if (direct_grads) {
        t.weight_grad = opt.grad_view(w).as<float>();
        t.bias_grad = opt.grad_view(b).as<float>();
      } else {
        t.weight_grad = grad_scratch.data();
        t.bias_grad = grad_scratch.data() + weight_numel;
      }
      net[l] = t;
    }
    seen_layout = opt.layout_version();
    have_views = true;
  };
  // 16-bit parameters -> the f32 working copies (after every step, outside the timed region).
  const auto widen_params = [&] {
    for (int l = 0; l < options.layers; ++l) {
      widen(opt.param_view(weight_id[l]), work.data() + l * layer_numel);
      widen(opt.param_view(bias_id[l]), work.data() + l * layer_numel + weight_numel);
    }
  };
  // The backward hook: layer l's f32 gradients (in grad_scratch), scaled by the loss scale,
  // go to the optimizer: narrowed into grad_view() (stage 1, or external buffers), or handed
  // with reduce_gradient() (stage 2, bucket view), weight then bias, in backward order.
  std::function<void(int)> layer_done;
  if (!direct_grads) {
    layer_done = [&](int l) {
      const float scale = static_cast<float>(opt.loss_scale());
      const shardopt::ParamId ids[2] = {weight_id[l], bias_id[l]};
      const int64_t offsets[2] = {0, weight_numel};
      const int64_t numels[2] = {weight_numel, width};
      for (int k = 0; k < 2; ++k) {
        const float* src = grad_scratch.data() + offsets[k];
        if (hand_gradients) {
          TensorRef grad{const_cast<float*>(src), numels[k], DType::f32, shardopt::Device::cpu()};
          if (half) {
            uint16_t* dst = hand_scratch.data() + offsets[k];
            narrow(src, numels[k], scale, dtype, dst);
            grad.data = dst;
            grad.dtype = dtype;
          }
          opt.reduce_gradient(ids[k], grad);
        } else {
          narrow(src, numels[k], scale, dtype, opt.grad_view(ids[k]).as<uint16_t>());
        }
      }
    };
  }

  const char* const mode_name = shard_state ? "sharded" : "replicated";
  if (!options.resume_dir.empty()) opt.load(options.resume_dir + "/" + mode_name);
  refresh_views();
  if (half) widen_params();

  Mlp mlp(options.layers, options.width, options.batch);
  std::vector<float> input(static_cast<std::size_t>(options.batch) * width);
  std::vector<float> target(input.size());
  make_batch(options.seed, rank, input, target);
  std::vector<double> step_ms;
  for (int step = 0; step < options.steps; ++step) {
    refresh_views();
    // The backward pass overwrites the gradients, so no zero_grad() is needed.
    const double loss = mlp.forward_backward(net, input.data(), target.data(), layer_done);
    opt.reduce_gradients();
    if (options.clip > 0.0) opt.clip_grad_norm(options.clip);

    // Time step() alone, between barriers, as one times torch's opt.step(): the update of
    // this rank's shard plus (sharded) the parameter sync.
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    opt.step();
    const auto stop = std::chrono::steady_clock::now();
    comm.barrier();
    step_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    if (half) {
      refresh_views();
      widen_params();
    }

    if (options.verbose) {
      float mean_loss = static_cast<float>(loss);
      comm.all_reduce(&mean_loss, 1, DType::f32, shardopt::ReduceOp::avg);
      if (rank == 0) {
        const shardopt::StepReport& report = opt.last_step();
        std::string extra;
        char buffer[128];
        if (config.loss_scaling.enabled) {
          std::snprintf(buffer, sizeof buffer, " loss_scale=%g skipped=%s skipped_steps=%" PRId64,
                        report.loss_scale, report.skipped ? "yes" : "no", report.skipped_steps);
          extra += buffer;
        }
        if (options.clip > 0.0) {
          std::snprintf(buffer, sizeof buffer, " grad_norm=%.6e clip_coef=%.6f", report.grad_norm,
                        report.clip_coef);
          extra += buffer;
        }
        std::printf("step=%d loss=%.6f%s (mode=%s)\n", step, static_cast<double>(mean_loss),
                    extra.c_str(), mode_name);
      }
    }
  }

  if (!options.save_dir.empty()) opt.save(options.save_dir + "/" + mode_name);

  refresh_views();
  double sum = 0.0;
  for (int l = 0; l < options.layers; ++l) {
    for (int64_t i = 0; i < weight_numel; ++i) sum += net[l].weight[i];
    for (int64_t i = 0; i < width; ++i) sum += net[l].bias[i];
  }
  // After step() every rank must hold the same parameters. Compare the sums bit for bit:
  // rank 0's 8 bytes travel as two f32 words (a broadcast does not interpret them).
  double root_sum = sum;
  comm.broadcast(&root_sum, 2, DType::f32, 0);
  float differs = std::memcmp(&root_sum, &sum, sizeof sum) != 0 ? 1.0f : 0.0f;
  comm.all_reduce(&differs, 1, DType::f32, shardopt::ReduceOp::max);
  if (differs != 0.0f) {
    throw shardopt::Error(shardopt::ErrorCode::mismatch,
                          std::string("ranks hold different parameters after mode=") + mode_name);
  }

  const shardopt::MemoryReport memory = opt.memory_report();
  if (options.verbose && rank == 0) {
    std::printf("memory: state_bytes=%" PRId64 " master_bytes=%" PRId64 " param_bytes=%" PRId64
                " grad_bytes=%" PRId64 " buffer_bytes=%" PRId64 " shard_numel=%" PRId64 " trainable_numel=%" PRId64
                " skipped_steps=%" PRId64 " (mode=%s, rank 0)\n",
                memory.state_bytes, memory.master_bytes, memory.param_bytes, memory.grad_bytes,
                memory.buffer_bytes, memory.shard_numel, memory.trainable_numel, opt.last_step().skipped_steps, mode_name);
  }
  ModeResult result;
  result.params = total_numel;
  result.stage = stage;
  result.state_bytes = memory.state_bytes + memory.master_bytes;
  result.grad_bytes = memory.grad_bytes;
  result.peak_rss_mb = peak_rss_mib();
  result.step_ms_median = median(step_ms);
  result.params_sum = sum;
  return result;
}

// ---- gradient check -------------------------------------------------------------------------

// Compares the BLAS backward pass with central differences of the double-precision reference
// loss. The error of one element is |analytic - numeric| / max(|analytic|, |numeric|, floor),
// where floor = 1e-3 * the largest numeric gradient keeps near-zero gradients (dominated by
// float rounding) from dominating. Returns the process exit status.
int check_gradients(Communicator& comm, const Options& options) {
  const int rank = comm.rank();
  const int layers = options.layers;
  const int64_t width = options.width;
  const int64_t weight_numel = width * width;

  std::vector<std::vector<float>> weights(layers, std::vector<float>(static_cast<std::size_t>(weight_numel)));
  std::vector<std::vector<float>> biases(layers, std::vector<float>(static_cast<std::size_t>(width)));
  std::vector<std::vector<float>> weight_grads = weights;
  std::vector<std::vector<float>> bias_grads = biases;
  std::vector<LinearTensors> net(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    init_linear(options.seed, l, options.width, weights[l].data(), weight_numel, biases[l].data(), width);
    net[l] = LinearTensors{weights[l].data(), biases[l].data(), weight_grads[l].data(), bias_grads[l].data()};
  }
  std::vector<float> input(static_cast<std::size_t>(options.batch) * width);
  std::vector<float> target(input.size());
  make_batch(options.seed, rank, input, target);

  Mlp mlp(layers, options.width, options.batch);
  const double loss = mlp.forward_backward(net, input.data(), target.data());

  std::vector<std::vector<double>> ref_weights(layers);
  std::vector<std::vector<double>> ref_biases(layers);
  for (int l = 0; l < layers; ++l) {
    ref_weights[l].assign(weights[l].begin(), weights[l].end());
    ref_biases[l].assign(biases[l].begin(), biases[l].end());
  }
  const auto ref = [&] {
    return reference_loss(layers, options.width, options.batch, ref_weights, ref_biases, input, target);
  };
  const double ref_loss = ref();

  // Every element of a small network; an evenly spread sample of a big one.
  const int64_t total = layers * (weight_numel + width);
  const int64_t max_checked = 4096;
  const int64_t stride = std::max<int64_t>(1, total / max_checked);
  std::vector<double> analytic;
  std::vector<double> numeric;
  int64_t index = 0;
  const auto probe = [&](double& value, float grad) {
    if (index++ % stride != 0) return;
    const double saved = value;
    const double h = 1e-6 * std::max(1.0, std::abs(saved));
    value = saved + h;
    const double up = ref();
    value = saved - h;
    const double down = ref();
    value = saved;
    analytic.push_back(grad);
    numeric.push_back((up - down) / (2.0 * h));
  };
  for (int l = 0; l < layers; ++l) {
    for (int64_t i = 0; i < weight_numel; ++i) probe(ref_weights[l][i], weight_grads[l][i]);
    for (int64_t i = 0; i < width; ++i) probe(ref_biases[l][i], bias_grads[l][i]);
  }

  double largest = 0.0;
  for (const double g : numeric) largest = std::max(largest, std::abs(g));
  const double floor = std::max(1e-3 * largest, std::numeric_limits<double>::min());
  double max_rel_err = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double scale = std::max({std::abs(analytic[i]), std::abs(numeric[i]), floor});
    max_rel_err = std::max(max_rel_err, std::abs(analytic[i] - numeric[i]) / scale);
  }
  const double loss_rel_err = std::abs(loss - ref_loss) / std::max(std::abs(ref_loss), 1e-30);

  // Each rank checked its own batch; report the worst.
  float worst[2] = {static_cast<float>(max_rel_err), static_cast<float>(loss_rel_err)};
  comm.all_reduce(worst, 2, DType::f32, shardopt::ReduceOp::max);
  const double tolerance = 1e-3;
  const bool pass = worst[0] <= tolerance && worst[1] <= tolerance;
  if (rank == 0) {
    std::printf("check_gradients layers=%d width=%d batch=%d checked=%zu max_rel_err=%.3e "
                "loss_rel_err=%.3e tolerance=%.0e result=%s\n",
                layers, options.width, options.batch, numeric.size(), static_cast<double>(worst[0]),
                static_cast<double>(worst[1]), tolerance, pass ? "pass" : "fail");
  }
  return pass ? 0 : 1;
}

// ---- main -----------------------------------------------------------------------------------

int run(int argc, char** argv) {
  std::shared_ptr<Communicator> comm = shardopt::mpi_world();
  const int rank = comm->rank();

  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const UsageError& e) {
    // Every rank sees the same command line and fails the same way; one message is enough.
    if (rank == 0) {
      std::fprintf(stderr, "shardopt-demo: %s\nusage: mpirun -np N shardopt-demo [options] (see --help)\n",
                   e.what());
    }
    return 2;
  }
  if (options.help) {
    if (rank == 0) std::fputs(usage_text, stdout);
    return 0;
  }

  // Ranks already run side by side on the cores; BLAS threads on top would oversubscribe them.
  openblas_set_num_threads(options.threads);

  if (options.check_gradients) return check_gradients(*comm, options);

  std::vector<bool> shard_states;
  if (options.modes != RunModes::replicated) shard_states.push_back(true);
  if (options.modes != RunModes::sharded) shard_states.push_back(false);

  std::vector<ModeResult> results;
  for (const bool shard_state : shard_states) {
    results.push_back(train(comm, options, shard_state));
    const ModeResult& r = results.back();
    if (rank == 0) {
      std::printf("mode=%s world=%d params=%" PRId64 " dtype=%s stage=%d state_bytes=%" PRId64
                  " grad_bytes=%" PRId64 " peak_rss_mb=%.1f step_ms_median=%.3f params_sum=%.9e\n",
                  shard_state ? "sharded" : "replicated", comm->size(), r.params,
                  shardopt::dtype_name(options.dtype), r.stage, r.state_bytes, r.grad_bytes,
                  r.peak_rss_mb, r.step_ms_median, r.params_sum);
      std::fflush(stdout);
    }
  }

  if (results.size() == 2) {
    // The sharded step must reproduce the replicated one bit for bit, so compare the bytes.
    const bool match = std::memcmp(&results[0].params_sum, &results[1].params_sum, sizeof(double)) == 0;
    if (rank == 0) std::printf("params_sum_match=%s\n", match ? "yes" : "no");
    return match ? 0 : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "shardopt-demo: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-demo: error: %s\n", e.what());
  }
  return 1;
}
