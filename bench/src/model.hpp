// bench/src/model.hpp — the step benchmark's model (a list of named tensors), its synthetic values, and the optimizers built over it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

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

// --params N: --tensors equal params; otherwise --layers x Linear(--width, --width), weight
// then bias, in torch's order.
Model make_model(const Options& o);

// The step's owned buffers for external storage (bucket view keeps them inside shardopt), as
// raw words of the dtype (f32: one word per element; bf16/f16: half a word).
struct ExternalBuffers {
  std::vector<float> params;
  std::vector<float> grads;
};

// The OptimizerConfig the flags describe.
shardopt::OptimizerConfig make_config(const Options& o);

// One param group over `pieces` (named as the model's tensors, in order) with the flags'
// hyperparameters; each param is declared on `device` with no data (shardopt-owned zeros) and
// its grad like it: callers pass buffers by setting .data.
shardopt::ParamGroupSpec make_group(const Options& o, const std::vector<Tensor>& pieces, shardopt::Device device);

// The synthetic initial parameters and gradients of global elements [first_index,
// first_index + out.numel), written into host memory of out.dtype (bf16/f16: rounded to nearest
// even from the f32 value). The same on every rank and in every run.
void fill_param_values(const shardopt::TensorRef& out, int64_t first_index, int threads);
void fill_grad_values(const shardopt::TensorRef& out, int64_t first_index, const Options& o);

// When the synthetic initial parameters reach a CPU optimizer. bf16/f16 masters are seeded
// from the parameters at registration, so the two give different (equally timed) trainings.
enum class InitialValues {
  // Written through param_view() after registration: no second copy of the model inflates the
  // peak RSS the step reports; bf16/f16 masters start from zeros (the first step then writes
  // the parameters from them).
  through_views,
  // Passed as the parameters' data at registration, as a trainer does: masters start from the
  // values. What the --device cuda step does, so its CPU reference does it too.
  at_registration,
};

// Builds an optimizer over `pieces` of the model ([first, first+numel) ranges of global
// indices) with synthetic initial values and gradients (through grad_view; at stage 2 with
// bucket view only where it has gradient views and --stage2-grads views: see hand_gradients).
std::unique_ptr<shardopt::ZeroOptimizer> build_optimizer(std::shared_ptr<shardopt::Communicator> comm,
                                                         const Options& o, shardopt::OptimizerConfig config,
                                                         const std::vector<Tensor>& pieces,
                                                         ExternalBuffers& external,
                                                         InitialValues initial = InitialValues::through_views);

// Whether the gradients are written through grad_view: everywhere but stage 2 with bucket
// view, and there where the optimizer has gradient views (one node, node-shared slots) unless
// --stage2-grads hand-over.
bool writes_grad_views(const shardopt::ZeroOptimizer& opt, const Options& o);

// Stage 2, before every step (untimed): every rank hands the same synthetic gradients (bucket
// view: one param at a time out of `scratch`, the whole model's gradients generated at the
// first call, in registration order; external: they are already in its buffers; gradient
// views: they are already in the views, nothing is handed) and reduce_gradients() averages
// them into their owners' shards.
void hand_gradients(shardopt::ZeroOptimizer& opt, const Options& o, const std::vector<Tensor>& pieces,
                    std::vector<float>& scratch);

// Elements [lo, hi) of the concatenated model, as pieces of its tensors.
std::vector<Tensor> model_slice(const Model& model, int64_t lo, int64_t hi);

}  // namespace shardopt_bench
