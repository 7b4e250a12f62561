// tests/parity/golden_data.hpp — torch.optim golden trajectories (tools/gen_golden.py) loaded for the parity tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/optimizer.hpp"

namespace shardopt_parity {

// The parity criterion of the brief: |a - b| <= 1e-6 * max(1, |b|), b being torch's value.
constexpr double kRelTolerance = 1e-6;

struct GoldenParam {
  std::string name;
  std::vector<float> init;
};

struct GoldenGroup {
  std::vector<int> params;  // indices into GoldenCase::params, in the group's torch order
  // Hyperparameters in force at each step (the start values with the schedule applied), so a
  // test only has to copy hyper_per_step[k] into the optimizer before step k.
  std::vector<shardopt::Hyperparams> hyper_per_step;
};

using StepTensors = std::vector<std::vector<float>>;  // [param][element]

struct GoldenCase {
  std::string name;
  std::string file;
  shardopt::Algorithm algorithm = shardopt::Algorithm::sgd;
  int steps = 0;
  std::vector<GoldenParam> params;
  std::vector<GoldenGroup> groups;
  std::vector<StepTensors> grads;     // [step]: the gradients fed before that step
  std::vector<StepTensors> expected;  // [step]: torch's params after that step
};

// $SHARDOPT_GOLDEN_DIR if set (the live test points it at freshly generated data), else the
// tests/data folder this program was built against.
std::string golden_dir();

// Every case listed in <dir>/golden_index.json. Throws std::runtime_error naming the file and
// the field when anything is missing or malformed: a parity test must not pass on no data.
std::vector<GoldenCase> load_golden_cases(const std::string& dir);

// One step of a gradient-clipping case (golden_clip_*.json).
struct GoldenClipStep {
  bool called = false;     // false: torch did not call clip_grad_norm_ before this step
  double max_norm = 0.0;
  float total_norm = 0.f;  // the float32 tensor torch's clip_grad_norm_ returned
  float clip_coef = 1.f;   // torch's clamp(max_norm / (total_norm + 1e-6), max=1), float32
};

struct GoldenClipCase {
  GoldenCase golden;                 // grads are the gradients before clipping
  double norm_type = 2.0;            // 2 or +infinity
  std::vector<GoldenClipStep> clip;  // [step]
};

// Every case listed in <dir>/golden_clip_index.json, with the same checks as load_golden_cases.
std::vector<GoldenClipCase> load_golden_clip_cases(const std::string& dir);

// Accumulates one comparison against torch's values.
struct Comparison {
  int64_t checked = 0;
  int64_t out_of_tolerance = 0;
  int64_t bitwise_different = 0;
  double worst_relative = 0.0;  // max |a-b| / max(1,|b|)
  std::string failures;         // the first few out-of-tolerance elements, for the report

  void add(const std::string& where, const float* actual, const std::vector<float>& expected);
  void merge(const Comparison& other);
  std::string summary() const;
};

}  // namespace shardopt_parity
