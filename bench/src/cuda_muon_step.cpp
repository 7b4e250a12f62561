// bench/src/cuda_muon_step.cpp — --mode step --device cuda --algorithm muon: Muon over the model's hidden matrices (AdamW over its biases) on CUDA parameters, timed, with its Newton-Schulz throughput, and checked against the CPU's Muon.
#include "cuda_muon_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuda_device.hpp"
#include "cuda_step.hpp"
#include "muon_step.hpp"
#include "precision.hpp"
#include "support.hpp"

namespace shardopt_bench {

using shardopt::Device;
using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

namespace {

float element_value(const TensorRef& t, int64_t i) {
  if (t.dtype == shardopt::DType::f32) return static_cast<const float*>(t.data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(t.data)[i];
  return t.dtype == shardopt::DType::bf16 ? shardopt::kernels::bf16_to_float(bits) : shardopt::kernels::f16_to_float(bits);
}

// How far the device optimizer's layer `layer` (its matrix and its bias) is from a CPU
// optimizer's over that layer alone after the same steps: the matrix's largest |difference|
// (cuBLAS and OpenBLAS sum the products in different orders, so within a tolerance, not
// bitwise) and the bias's differing elements (AdamW: the CUDA kernels are bitwise the CPU's).
struct LayerCheck {
  double matrix_max_abs_diff = 0;
  int64_t bias_wrong = 0;
  bool finite = true;
};

LayerCheck check_layer(const std::shared_ptr<Communicator>& host, const Options& o, const Model& model,
                       const ZeroOptimizer& opt, int layer, int steps) {
  OptimizerConfig config = muon_config(o);
  config.stage = 1;
  const MuonPieces pieces = muon_pieces(model, {layer});
  std::unique_ptr<ZeroOptimizer> reference = build_muon_optimizer(host->split(host->rank(), 0), o, config, pieces);
  for (int s = 0; s < steps; ++s) reference->step();
  LayerCheck check;
  std::vector<uint32_t> scratch;
  const auto compare = [&](shardopt::ParamId device_id, shardopt::ParamId reference_id, bool bitwise) {
    const TensorRef got = read_to_host(opt.param_view(device_id), scratch);
    const TensorRef want = reference->param_view(reference_id);
    for (int64_t k = 0; k < got.numel; ++k) {
      const float g = element_value(got, k), w = element_value(want, k);
      check.finite = check.finite && std::isfinite(g);
      if (bitwise) check.bias_wrong += g == w || (std::isnan(g) && std::isnan(w)) ? 0 : 1;
      else check.matrix_max_abs_diff = std::max(check.matrix_max_abs_diff, static_cast<double>(std::fabs(g - w)));
    }
  };
  compare(static_cast<shardopt::ParamId>(layer), 0, false);
  compare(static_cast<shardopt::ParamId>(o.layers + layer), 1, true);
  return check;
}

}  // namespace

int run_cuda_muon_step(const std::shared_ptr<Communicator>& host, const std::shared_ptr<Communicator>& device_comm,
                       const Options& flags) {
  Options o = flags;
  if (!o.threads_given) o.threads = 0;  // the CPU reference and the synthetic values: every core
  const int world = host->size();
  const Model model = make_model(o);
  const OptimizerConfig config = muon_config(o);
  const DeviceInfo info = current_device_info();
  const Device device = Device::cuda(info.index);
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));

  std::vector<int> layers(static_cast<std::size_t>(o.layers));
  for (int l = 0; l < o.layers; ++l) layers[static_cast<std::size_t>(l)] = l;
  const MuonPieces pieces = muon_pieces(model, layers);
  const std::vector<Tensor> weights(pieces.by_id.begin(), pieces.by_id.begin() + pieces.matrices);
  const std::vector<Tensor> biases(pieces.by_id.begin() + pieces.matrices, pieces.by_id.end());

  // Parameters registered from cudaMalloc'd memory holding their initial values (bucket view
  // copies them into its own flat buffer); gradients written into the grad views.
  auto params = std::make_unique<DeviceBuffer>(model.numel * element_bytes);
  upload_model_values(params->data(), model, o, true);
  const auto on_device = [&](ParamGroupSpec group, const std::vector<Tensor>& tensors) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      group.params[i].param.data = static_cast<char*>(params->data()) + tensors[i].offset * element_bytes;
    }
    return group;
  };
  ParamGroupSpec muon = on_device(make_group(o, weights, device), weights);
  muon.settings.algorithm = Algorithm::muon;
  for (shardopt::ParamSpec& spec : muon.params) spec.shape = {o.width, o.width};
  ParamGroupSpec adamw = on_device(make_group(o, biases, device), biases);
  adamw.settings.algorithm = Algorithm::adamw;
  ZeroOptimizer opt(device_comm, config, {std::move(muon), std::move(adamw)});
  synchronize_device();
  params.reset();
  upload_grad_views(opt, pieces.by_id, o);

  const CudaTiming timing = time_cuda_steps(*host, opt, o.warmup, o.iters);

  // Each rank checks one layer (layer = its rank) against the CPU: after the sync every rank
  // holds every matrix, so the ranks' layers cover different owners.
  std::string check_text = "N/A";
  bool failed = false;
  if (o.check) {
    const int layer = std::min(host->rank(), o.layers - 1);
    const LayerCheck mine = check_layer(host, o, model, opt, layer, o.warmup + o.iters);
    const std::vector<double> all = all_gather_exact(*host, std::vector<double>{mine.matrix_max_abs_diff,
                                                                               static_cast<double>(mine.bias_wrong),
                                                                               mine.finite ? 1.0 : 0.0});
    double diff = 0, bias_wrong = 0;
    bool finite = true;
    for (int r = 0; r < world; ++r) {
      diff = std::max(diff, all[static_cast<std::size_t>(3 * r)]);
      bias_wrong += all[static_cast<std::size_t>(3 * r + 1)];
      finite = finite && all[static_cast<std::size_t>(3 * r + 2)] == 1.0;
    }
    // In units of the learning rate: how many steps' worth the matrices are apart.
    const double steps_apart = diff / o.lr;
    failed = !finite || bias_wrong != 0;
    check_text = fmt::format("matrix_max_abs_diff_vs_cpu={:.3g} matrix_diff_in_lr={:.3g} bias_wrong={} finite={}", diff,
                             steps_apart, static_cast<int64_t>(bias_wrong), finite ? "yes" : "no");
  }

  // Newton-Schulz flops of the whole model per step: ns_steps x (4 m n min + 2 min^3), square.
  const double width = o.width;
  const double ns_gflop = shardopt::default_hyperparams(Algorithm::muon).ns_steps * 6.0 * width * width * width * o.layers / 1e9;
  const double step_s = timing.step_s;
  say(*host,
      "device=cuda gpu={} comm={} world={} params={} {} optimizer=muon+adamw matrices={} biases={} dtype={} "
      "muon_precision={} iters={} warmup={} ns_gflop_per_step={:.1f} step_ms_median={:.3f} gpu_event_ms_median={:.3f} "
      "ns_tflops_whole_step={:.1f} {}\n",
      token(info.name), device_comm->backend_name(), world, model.numel, model.description, o.layers, o.layers,
      shardopt::dtype_name(o.dtype), o.muon_precision == shardopt::MatrixPrecision::f32 ? "f32" : "bf16", o.iters,
      o.warmup, ns_gflop, step_s * 1e3, timing.event_s * 1e3, step_s > 0 ? ns_gflop / step_s / 1e3 : 0.0, check_text);
  return failed ? 1 : 0;
}

}  // namespace shardopt_bench
