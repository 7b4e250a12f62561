// bench/src/muon_step.cpp — --mode step --algorithm muon: Muon over the model's hidden matrices (AdamW over its biases) with whole-matrix owners; the step, its Newton-Schulz, update and sync, checked against one rank.
#include "muon_step.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <cblas.h>

#include <fmt/format.h>

#include "cpu/blas_core.hpp"
#include "cpu/muon_cpu.hpp"
#include "model.hpp"
#include "support.hpp"

namespace shardopt_bench {

using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::ZeroOptimizer;

MuonPieces muon_pieces(const Model& model, const std::vector<int>& layers) {
  MuonPieces pieces;
  for (int l : layers) pieces.by_id.push_back(model.tensors[static_cast<std::size_t>(2 * l)]);
  for (int l : layers) pieces.by_id.push_back(model.tensors[static_cast<std::size_t>(2 * l + 1)]);
  pieces.matrices = static_cast<int64_t>(layers.size());
  return pieces;
}

OptimizerConfig muon_config(const Options& o) {
  OptimizerConfig config = make_config(o);
  config.algorithm = Algorithm::adamw;  // the biases' group; the weights' names Muon
  config.muon.precision = o.muon_precision;
  config.muon.blas_threads = o.blas_threads;
  return config;
}

// An optimizer over `layers` of the model with the synthetic values of model.cpp (the same
// global indices, so any subset of layers starts from the same numbers). Stage 2 leaves the
// gradients to hand_gradients (unless it has gradient views).
std::unique_ptr<ZeroOptimizer> build_muon_optimizer(std::shared_ptr<Communicator> comm, const Options& o,
                                                    const OptimizerConfig& config, const MuonPieces& pieces) {
  const std::vector<Tensor> weights(pieces.by_id.begin(), pieces.by_id.begin() + pieces.matrices);
  const std::vector<Tensor> biases(pieces.by_id.begin() + pieces.matrices, pieces.by_id.end());
  ParamGroupSpec muon = make_group(o, weights, shardopt::Device::cpu());
  muon.settings.algorithm = Algorithm::muon;
  for (shardopt::ParamSpec& spec : muon.params) spec.shape = {o.width, o.width};
  ParamGroupSpec adamw = make_group(o, biases, shardopt::Device::cpu());
  adamw.settings.algorithm = Algorithm::adamw;
  auto opt = std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{muon, adamw});
  for (std::size_t i = 0; i < pieces.by_id.size(); ++i) {
    const auto id = static_cast<shardopt::ParamId>(i);
    fill_param_values(opt->param_view(id), pieces.by_id[i].offset, o.threads);
    const bool views = config.stage == 1 || (config.storage == shardopt::Storage::bucket_view && writes_grad_views(*opt, o));
    if (views) fill_grad_values(opt->grad_view(id), pieces.by_id[i].offset, o);
  }
  return opt;
}

namespace {

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// Elements that differ from one rank's: every rank's parameters hash as rank 0's, and the
// layers l with l % world == rank equal bitwise a single-rank optimizer's over those layers
// alone after the same steps (Muon's update of a matrix depends on that matrix only).
int64_t count_wrong_muon(const std::shared_ptr<Communicator>& comm, const Options& o, const Model& model,
                         const ZeroOptimizer& opt, const MuonPieces& all, int steps) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (int id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef p = opt.param_view(id);
    hash = fnv1a(p.data, p.nbytes(), hash);
  }
  const std::vector<int64_t> hashes = gather_int64(*comm, static_cast<int64_t>(hash));
  int64_t wrong = 0;
  for (int64_t h : hashes) wrong += h != hashes[0] ? 1 : 0;

  std::vector<int> mine;
  for (int l = comm->rank(); l < o.layers; l += comm->size()) mine.push_back(l);
  int64_t mine_wrong = 0;
  if (!mine.empty()) {
    OptimizerConfig config = muon_config(o);
    config.stage = 1;  // the gradients stand as written: what a stage-2 reduce of them averages to
    const MuonPieces pieces = muon_pieces(model, mine);
    std::unique_ptr<ZeroOptimizer> reference = build_muon_optimizer(comm->split(comm->rank(), 0), o, config, pieces);
    for (int s = 0; s < steps; ++s) reference->step();
    for (std::size_t i = 0; i < pieces.by_id.size(); ++i) {
      // The same tensor's id in the full optimizer.
      const auto at = std::find_if(all.by_id.begin(), all.by_id.end(),
                                   [&](const Tensor& t) { return t.offset == pieces.by_id[i].offset; });
      const shardopt::TensorRef got = opt.param_view(static_cast<shardopt::ParamId>(at - all.by_id.begin()));
      const shardopt::TensorRef want = reference->param_view(static_cast<shardopt::ParamId>(i));
      const auto* g = static_cast<const unsigned char*>(got.data);
      const auto* w = static_cast<const unsigned char*>(want.data);
      const std::size_t element = shardopt::dtype_size(o.dtype);
      for (int64_t k = 0; k < got.numel; ++k) {
        mine_wrong += std::equal(g + k * element, g + (k + 1) * element, w + k * element) ? 0 : 1;
      }
    }
  }
  return wrong + sum_int64(*comm, mine_wrong);
}

}  // namespace

int run_muon_step(const std::shared_ptr<Communicator>& comm, const Options& o) {
  const int world = comm->size();
  // Before the first product (as the library's Newton-Schulz does): what OpenBLAS picked at load
  // and the core the products run on.
  const shardopt::kernels::BlasCore& blas = shardopt::kernels::ensure_blas_core();
  say(*comm, "# OpenBLAS core: {}\n", blas.why);
  const Model model = make_model(o);
  const OptimizerConfig config = muon_config(o);
  std::vector<int> layers(static_cast<std::size_t>(o.layers));
  for (int l = 0; l < o.layers; ++l) layers[static_cast<std::size_t>(l)] = l;
  const MuonPieces pieces = muon_pieces(model, layers);
  std::unique_ptr<ZeroOptimizer> opt = build_muon_optimizer(comm, o, config, pieces);

  std::vector<float> grad_scratch;
  const auto prepare = [&] {
    if (config.stage == 2) hand_gradients(*opt, o, pieces.by_id, grad_scratch);
  };
  for (int i = 0; i < o.warmup; ++i) {
    prepare();
    opt->step();
  }
  // This rank's [step, agree, update, newton_schulz, sync] of every timed step.
  constexpr std::size_t kFields = 5;
  std::vector<double> mine;
  for (int i = 0; i < o.iters; ++i) {
    prepare();
    comm->barrier();
    const auto start = Clock::now();
    opt->step();
    const double seconds = seconds_since(start);
    const shardopt::StepReport& r = opt->last_step();
    mine.insert(mine.end(), {seconds, r.agree_seconds, r.update_seconds, r.newton_schulz_seconds, r.sync_seconds});
    comm->barrier();
  }
  const std::vector<double> all = all_gather_exact(*comm, mine);
  // Per step, the slowest rank's phases (the rank a user waits for), and the longest
  // Newton-Schulz of any rank (how evenly the owners split the orthogonalisations).
  std::vector<std::vector<double>> slowest(kFields);
  // The sync as the slowest rank saw it includes waiting for the owner that finished its
  // updates last; that owner's own sync is the transfer alone, and the spread of the ranks'
  // update times is the waiting (how unevenly the owners' work ran, not the broadcast's cost).
  std::vector<double> ns_longest, ns_shortest, sync_last_owner, update_spread;
  for (std::size_t i = 0; i < static_cast<std::size_t>(o.iters); ++i) {
    const double* worst = &all[kFields * i];
    const double* last_owner = worst;
    double longest = 0, shortest = 1e300, update_shortest = 1e300;
    for (int r = 0; r < world; ++r) {
      const double* row = &all[static_cast<std::size_t>(r) * mine.size() + kFields * i];
      if (row[0] > worst[0]) worst = row;
      if (row[2] > last_owner[2]) last_owner = row;
      longest = std::max(longest, row[3]);
      shortest = std::min(shortest, row[3]);
      update_shortest = std::min(update_shortest, row[2]);
    }
    for (std::size_t f = 0; f < kFields; ++f) slowest[f].push_back(worst[f]);
    ns_longest.push_back(longest);
    ns_shortest.push_back(shortest);
    sync_last_owner.push_back(last_owner[4]);
    update_spread.push_back(last_owner[2] - update_shortest);
  }
  const double step_s = median(slowest[0]);
  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    wrong_total = count_wrong_muon(comm, o, model, *opt, pieces, o.warmup + o.iters);
    wrong = std::to_string(wrong_total);
  }
  // Newton-Schulz flops of the whole model per step: ns_steps x (4 m n min + 2 min^3), square.
  const double width = o.width;
  const double ns_gflop = 5.0 * 6.0 * width * width * width * o.layers / 1e9;
  // The busiest owner's matrices (equal matrices: the greedy rule deals them out evenly).
  const double busiest_gflop = ns_gflop / o.layers * ((o.layers + world - 1) / world);
  say(*comm,
      "world={} params={} {} optimizer=muon+adamw matrices={} biases={} partition={} dtype={} stage={} "
      "muon_precision={} blas_threads={} blas_core={} blas_core_at_load={} bf16_products={} iters={} warmup={} ns_gflop_per_step={:.1f} "
      "step_ms_median={:.3f} agree_ms_median={:.3f} update_ms_median={:.3f} newton_schulz_ms_median={:.3f} "
      "newton_schulz_longest_rank_ms={:.3f} newton_schulz_shortest_rank_ms={:.3f} sync_ms_median={:.3f} "
      "sync_last_owner_ms_median={:.3f} update_spread_ms_median={:.3f} ns_gflops_busiest_rank={:.1f} wrong={}\n",
      world, model.numel, model.description, o.layers, o.layers, shardopt::partition_name(o.partition),
      shardopt::dtype_name(o.dtype), config.stage, o.muon_precision == shardopt::MatrixPrecision::f32 ? "f32" : "bf16",
      o.blas_threads, openblas_get_corename(), blas.picked_at_load,
      shardopt::kernels::bf16_products_on_amx() ? "amx" : "openblas_sgemm", o.iters, o.warmup, ns_gflop, step_s * 1e3, median(slowest[1]) * 1e3,
      median(slowest[2]) * 1e3, median(slowest[3]) * 1e3, median(ns_longest) * 1e3, median(ns_shortest) * 1e3,
      median(slowest[4]) * 1e3, median(sync_last_owner) * 1e3, median(update_spread) * 1e3, median(ns_longest) > 0 ? busiest_gflop / median(ns_longest) : 0.0, wrong);
  return wrong_total != 0 ? 1 : 0;
}

}  // namespace shardopt_bench
