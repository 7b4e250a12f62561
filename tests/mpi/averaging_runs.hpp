// tests/mpi/averaging_runs.hpp — the post-local SGD runs the averaging tests share: one replica's optimizer per rank, each rank's gradients, a live run's trajectory.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float <-> bf16 (nearest even)
#include "shardopt/shardopt.hpp"

namespace averaging_runs {

using namespace shardopt;

inline const std::vector<int64_t> kSizes = {37, 5, 130, 1, 64};
constexpr int kSteps = 9;

struct Scenario {
  int replica_size = 1;
  AveragerConfig averaging;
  Algorithm algorithm = Algorithm::adam;
  PartitionStrategy partition = PartitionStrategy::flat;
  int stage = 1;
  DType dtype = DType::f32;
  bool shard_state = true;
  uint32_t param_seed = 11;  // the initial parameter values
};

// Rank r's local gradient of param `id` at step t: different on every rank and step (and for
// every `salt`: another run's gradients).
inline std::vector<float> local_grad(int rank, int t, std::size_t id, uint32_t salt = 0) {
  return shardopt_test::seeded_values(1000u + 97u * static_cast<uint32_t>(rank) + 13u * static_cast<uint32_t>(t) +
                                          static_cast<uint32_t>(id) + 100003u * salt,
                                      kSizes[id], 0.5f);
}

inline OptimizerConfig optimizer_config(const Scenario& s) {
  OptimizerConfig config;
  config.algorithm = s.algorithm;
  config.partition = s.partition;
  config.stage = s.stage;
  config.shard_state = s.shard_state;
  return config;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(kernels::float_to_bf16(x));
  return out;
}

// The optimizer's params, widened to f32, in id order.
inline std::vector<float> params_of(const ZeroOptimizer& opt) {
  std::vector<float> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = opt.param_view(id);
    for (int64_t i = 0; i < v.numel; ++i) {
      out.push_back(v.dtype == DType::f32 ? v.as<float>()[i] : kernels::bf16_to_float(v.as<uint16_t>()[i]));
    }
  }
  return out;
}

// One replica's optimizer, with the same initial values on every rank.
struct Replica {
  shardopt_test::SeededParams params;
  std::vector<std::vector<uint16_t>> half;
  std::unique_ptr<ZeroOptimizer> opt;

  Replica(std::shared_ptr<Communicator> comm, const Scenario& s) : params(kSizes, s.param_seed) {
    ParamGroupSpec group = params.all();
    if (s.dtype == DType::bf16) {
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        half.push_back(to_bf16(params.values[i]));
        group.params[i].param = TensorRef{half[i].data(), kSizes[i], DType::bf16};
      }
    }
    opt = std::make_unique<ZeroOptimizer>(std::move(comm), optimizer_config(s), std::vector<ParamGroupSpec>{group});
  }
};

// Hands this rank's gradients of step t to `plsgd` (grad views at stage 1, reduce_gradient at
// stage 2) and reduces them.
inline void hand_gradients(PostLocalSGDOptimizer& plsgd, const Scenario& s, int t, uint32_t salt = 0) {
  ZeroOptimizer& opt = plsgd.optimizer();
  for (std::size_t id = 0; id < kSizes.size(); ++id) {
    const std::vector<float> g = local_grad(shardopt_test::world()->rank(), t, id, salt);
    if (s.dtype == DType::bf16) {
      const std::vector<uint16_t> h = to_bf16(g);
      if (s.stage == 2) {
        plsgd.reduce_gradient(static_cast<ParamId>(id), TensorRef{const_cast<uint16_t*>(h.data()), kSizes[id], DType::bf16});
      } else {
        std::memcpy(opt.grad_view(static_cast<ParamId>(id)).data, h.data(), h.size() * 2);
      }
    } else if (s.stage == 2) {
      plsgd.reduce_gradient(static_cast<ParamId>(id), TensorRef{const_cast<float*>(g.data()), kSizes[id]});
    } else {
      std::memcpy(opt.grad_view(static_cast<ParamId>(id)).data, g.data(), g.size() * 4);
    }
  }
  plsgd.reduce_gradients();
}

// The live run: this rank's replica's params after every step.
inline std::vector<std::vector<float>> live_run(const Scenario& s, int steps = kSteps) {
  const int rank = shardopt_test::world()->rank();
  Replica replica(shardopt_test::world()->split(rank / s.replica_size, rank), s);
  PostLocalSGDOptimizer plsgd(shardopt_test::world(), *replica.opt, s.averaging);
  std::vector<std::vector<float>> trajectory;
  for (int t = 0; t < steps; ++t) {
    hand_gradients(plsgd, s, t);
    plsgd.step();
    trajectory.push_back(params_of(*replica.opt));
  }
  return trajectory;
}

}  // namespace averaging_runs
