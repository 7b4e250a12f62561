// bench/src/verify.cpp — compares the parameters across ranks (a hash) and against a single-rank reference optimizer over each rank's slice of the model.
#include "verify.hpp"

#include <cstddef>
#include <vector>

#include "support.hpp"

namespace shardopt_bench {

using shardopt::OptimizerConfig;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

namespace {

uint64_t fnv1a(const void* data, std::size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001B3ull;
  return hash;
}

// Ranks whose parameters hash differently from rank 0's.
int64_t differing_ranks(Communicator& comm, const ZeroOptimizer& opt, const ParamReader& read) {
  uint64_t hash = 0xCBF29CE484222325ull;
  std::vector<uint32_t> scratch;
  for (int id = 0; id < opt.num_params(); ++id) {
    const TensorRef p = read(id, scratch);
    hash = fnv1a(p.data, p.nbytes(), hash);
  }
  const std::vector<int64_t> hashes = gather_int64(comm, static_cast<int64_t>(hash));
  int64_t differing = 0;
  for (int64_t h : hashes) differing += h != hashes[0] ? 1 : 0;
  return differing;
}

// Parameters of this rank's 1/N slice of the model that differ bitwise from a single-rank
// optimizer over the same slice that took the same `steps` steps.
int64_t wrong_vs_reference(const std::shared_ptr<Communicator>& solo, const Options& o, const Model& model,
                           const ParamReader& read, InitialValues initial, int rank, int world, int steps) {
  const int64_t lo = model.numel * rank / world, hi = model.numel * (rank + 1) / world;
  // q8 blocks start at each parameter's first element: the reference takes whole parameters
  // (every world-th one), which it keeps whole (sorted_greedy over one rank).
  const bool q8 = o.state_precision == shardopt::StatePrecision::q8;
  std::vector<Tensor> pieces;
  if (q8) {
    for (std::size_t i = static_cast<std::size_t>(rank); i < model.tensors.size(); i += static_cast<std::size_t>(world)) {
      pieces.push_back(model.tensors[i]);
    }
  } else {
    pieces = model_slice(model, lo, hi);
  }
  if (pieces.empty()) return 0;
  OptimizerConfig config = make_config(o);
  config.storage = Storage::bucket_view;
  config.partition = q8 ? PartitionStrategy::sorted_greedy : PartitionStrategy::flat;
  config.shard_state = true;
  config.stage = 1;  // the gradients stand as written: what a stage-2 reduce of them averages to
  ExternalBuffers unused;
  std::unique_ptr<ZeroOptimizer> reference = build_optimizer(solo, o, config, pieces, unused, initial);
  for (int s = 0; s < steps; ++s) reference->step();
  int64_t wrong = 0;
  std::vector<uint32_t> scratch;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Tensor& piece = pieces[i];
    // The model tensor this piece came from, and where the piece starts inside it.
    std::size_t owner = 0;
    while (model.tensors[owner].offset + model.tensors[owner].numel <= piece.offset) ++owner;
    const int64_t inside = piece.offset - model.tensors[owner].offset;
    const TensorRef got = read(static_cast<shardopt::ParamId>(owner), scratch);
    const TensorRef want = reference->param_view(static_cast<shardopt::ParamId>(i));
    const auto count = [&](const auto* g, const auto* w) {
      for (int64_t k = 0; k < piece.numel; ++k) wrong += g[inside + k] != w[k] ? 1 : 0;
    };
    if (o.dtype == DType::f32) count(got.as<const uint32_t>(), want.as<const uint32_t>());
    else count(got.as<const uint16_t>(), want.as<const uint16_t>());
  }
  return wrong;
}

}  // namespace

int64_t count_wrong_params(const std::shared_ptr<Communicator>& comm, const Options& o, const Model& model,
                           const ZeroOptimizer& opt, int steps, const ParamReader& read, InitialValues initial) {
  const int64_t differing = differing_ranks(*comm, opt, read);
  // Every rank gets its own single-rank communicator for the reference.
  std::shared_ptr<Communicator> solo = comm->split(comm->rank(), 0);
  const int64_t mine = wrong_vs_reference(solo, o, model, read, initial, comm->rank(), comm->size(), steps);
  return differing + sum_int64(*comm, mine);
}

int64_t count_wrong_params(const std::shared_ptr<Communicator>& comm, const Options& o, const Model& model,
                           const ZeroOptimizer& opt, int steps) {
  return count_wrong_params(comm, o, model, opt, steps, [&](shardopt::ParamId id, std::vector<uint32_t>&) {
    return opt.param_view(id);
  }, InitialValues::through_views);
}

}  // namespace shardopt_bench
