// tests/parity/parity_clip_test.cpp — ZeroOptimizer::clip_grad_norm replayed over torch.nn.utils.clip_grad_norm_'s golden trajectories.
//
// Each golden_clip_*.json case (tools/gen_golden.py) feeds the same gradients on every rank (so
// no reduce_gradients: the average of identical gradients is those gradients), calls
// clip_grad_norm(max_norm, norm_type) where torch called clip_grad_norm_, then step(), and checks:
//  - the returned norm against torch's. inf: exactly equal, since a maximum of |g| is exact in
//    any precision and any order. 2: within kRelTolerance relative, not bitwise: torch reduces
//    each tensor in float32 in the order of its vectorised kernel and then takes the norm of the
//    stacked per-tensor norms, rounding to float32 at each stage (a few float32 ulps, ~1e-7,
//    from the exact value), while shardopt accumulates this rank's shard in double in shard
//    order and combines the ranks' partial sums;
//  - last_step().grad_norm is the returned value (bitwise), or -1 after a step with no call;
//  - last_step().clip_coef < 1 exactly on the steps where torch's norm > max_norm (then close to
//    torch's factor), and exactly 1 on every other step: a factor never carries over to a step
//    without its own clip_grad_norm call;
//  - the gradients keep their values (the factor is applied inside the update);
//  - every param after every step within the tolerance of parity_optimizer_test (Comparison);
//  - every rank holds bitwise the same norms, reports and params (rank 0's broadcast).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "golden_data.hpp"
#include "golden_replay.hpp"
#include "mpi/mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_parity::Comparison;
using shardopt_parity::GoldenCase;
using shardopt_parity::GoldenClipCase;
using shardopt_parity::GoldenClipStep;
using shardopt_parity::kRelTolerance;

struct Run {
  Comparison cmp;         // params against torch's
  std::string problems;   // every other failed check, one line each
  std::vector<float> record;  // everything that must be bitwise equal on every rank
};

// Appends a double's bytes to a float record (the communicator moves f32 elements; a broadcast
// copies bytes, so any bit pattern survives).
void record_double(std::vector<float>& record, double value) {
  float halves[2];
  static_assert(sizeof(halves) == sizeof(value), "double is two floats wide");
  std::memcpy(halves, &value, sizeof(value));
  record.insert(record.end(), halves, halves + 2);
}

// The exact 2-norm of the golden gradients, for the failure report only (long double sum).
double reference_norm(const GoldenCase& c, std::size_t step, double norm_type) {
  long double acc = 0.0L;
  for (const std::vector<float>& g : c.grads[step]) {
    for (float v : g) {
      const long double a = std::fabs(static_cast<long double>(v));
      acc = std::isinf(norm_type) ? std::max(acc, a) : acc + a * a;
    }
  }
  return static_cast<double>(std::isinf(norm_type) ? acc : std::sqrt(acc));
}

// Checks one step's clip_grad_norm result and last_step() against torch; appends to `problems`.
void check_norm(const GoldenClipCase& c, int k, double norm, const StepReport& report,
                std::string& problems) {
  const GoldenClipStep& s = c.clip[static_cast<std::size_t>(k)];
  const double torch_norm = s.total_norm;
  const std::string at = fmt::format("  step {}", k + 1);
  if (std::isinf(c.norm_type)) {
    if (!(norm == torch_norm)) {
      problems += fmt::format("{}: inf-norm {:.17g} ({:a}) != torch's {:.9g} ({:a}); a max is exact\n", at,
                              norm, norm, torch_norm, torch_norm);
    }
  } else if (!(std::fabs(norm - torch_norm) <= kRelTolerance * torch_norm)) {
    problems += fmt::format("{}: 2-norm {:.17g} vs torch's float32 {:.9g}: relative difference {:.3g} > {:g} "
                            "(exact norm of the golden grads {:.17g})\n", at, norm, torch_norm,
                            std::fabs(norm - torch_norm) / torch_norm, kRelTolerance,
                            reference_norm(c.golden, static_cast<std::size_t>(k), c.norm_type));
  }
  if (std::memcmp(&report.grad_norm, &norm, sizeof(double)) != 0) {
    problems += fmt::format("{}: last_step().grad_norm {:.17g} is not the {:.17g} clip_grad_norm returned\n", at,
                            report.grad_norm, norm);
  }
  const bool torch_clipped = torch_norm > s.max_norm;
  if (torch_clipped) {
    const double torch_coef = s.clip_coef;
    if (!(report.clip_coef < 1.0) || !(std::fabs(report.clip_coef - torch_coef) <= kRelTolerance * torch_coef)) {
      problems += fmt::format("{}: norm {:.9g} > max_norm {:g}: clip_coef {:.17g}, torch's {:.9g}\n", at,
                              torch_norm, s.max_norm, report.clip_coef, torch_coef);
    }
  } else if (!(report.clip_coef == 1.0)) {
    problems += fmt::format("{}: norm {:.9g} <= max_norm {:g}: clip_coef {:.17g}, expected exactly 1\n", at,
                            torch_norm, s.max_norm, report.clip_coef);
  }
}

// Replays one case at this world size; see the top of the file for what is checked.
Run replay(const GoldenClipCase& clip_case, PartitionStrategy partition, Storage storage) {
  const GoldenCase& c = clip_case.golden;
  shardopt_parity::GoldenReplay replay(c, partition, storage);
  ZeroOptimizer& opt = *replay.opt;
  const std::vector<ParamId>& ids = replay.ids;
  auto grad_of = [&](std::size_t i) { return replay.grad(i, c.grads.front()[i].size(), c.params[i].name); };

  Run run;
  for (int k = 0; k < c.steps; ++k) {
    const std::size_t step = static_cast<std::size_t>(k);
    const GoldenClipStep& s = clip_case.clip[step];
    for (int g = 0; g < static_cast<int>(c.groups.size()); ++g) {
      opt.hyperparams(g) = c.groups[static_cast<std::size_t>(g)].hyper_per_step[step];
    }
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::vector<float>& g = c.grads[step][i];
      std::copy(g.begin(), g.end(), grad_of(i));
    }
    double norm = -1.0;
    if (s.called) {
      norm = opt.clip_grad_norm(s.max_norm, clip_case.norm_type);
      for (std::size_t i = 0; i < c.params.size(); ++i) {
        const std::vector<float>& g = c.grads[step][i];
        if (std::memcmp(grad_of(i), g.data(), g.size() * sizeof(float)) != 0) {
          run.problems += fmt::format("  step {}: clip_grad_norm changed the gradient of {}\n", k + 1,
                                      c.params[i].name);
        }
      }
    }
    opt.step();
    const StepReport report = opt.last_step();
    if (s.called) {
      check_norm(clip_case, k, norm, report, run.problems);
    } else if (!(report.grad_norm == -1.0) || !(report.clip_coef == 1.0)) {
      run.problems += fmt::format("  step {} (no clip_grad_norm call): last_step() grad_norm {:.17g}, clip_coef "
                                  "{:.17g}; expected -1 and 1\n", k + 1, report.grad_norm, report.clip_coef);
    }
    if (report.skipped) run.problems += fmt::format("  step {}: last_step().skipped without loss scaling\n", k + 1);
    record_double(run.record, norm);
    record_double(run.record, report.grad_norm);
    record_double(run.record, report.clip_coef);
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::string& name = c.params[i].name;
      const float* now = replay.param(i, name);
      run.cmp.add(fmt::format("step {} {}", k + 1, name), now, c.expected[step][i]);
      run.record.insert(run.record.end(), now, now + replay.params[i].size());
      if (opt.param_step(ids[i]) != k + 1) {
        run.problems += fmt::format("  after step {}: param_step({}) = {}\n", k + 1, name, opt.param_step(ids[i]));
      }
    }
  }
  return run;
}

// Where this rank's record differs from rank 0's ("" if bitwise equal). Collective: the record
// has the same length on every rank (same case, same steps).
std::string differences_from_rank0(const std::vector<float>& record) {
  Communicator& comm = *shardopt_test::world();
  std::vector<float> root = record;
  comm.broadcast(root.data(), static_cast<int64_t>(root.size()), DType::f32, 0);
  if (std::memcmp(root.data(), record.data(), record.size() * sizeof(float)) == 0) return "";
  std::size_t first = 0;
  while (std::memcmp(&root[first], &record[first], sizeof(float)) == 0) ++first;
  return fmt::format("rank {} differs from rank 0 from record element {} of {}", comm.rank(), first, record.size());
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return text;
}

}  // namespace

TEST_CASE("clip_grad_norm reproduces torch.nn.utils.clip_grad_norm_ and the clipped trajectories",
          "[parity][clip]") {
  const std::string dir = shardopt_parity::golden_dir();
  const int world_size = shardopt_test::world()->size();
  const int rank = shardopt_test::world()->rank();
  INFO("golden data: " << dir << ", rank " << rank << " of " << world_size);
  const std::vector<GoldenClipCase> cases = shardopt_parity::load_golden_clip_cases(dir);
  REQUIRE(!cases.empty());
  const char* verbose_env = std::getenv("SHARDOPT_PARITY_VERBOSE");
  const bool verbose = verbose_env != nullptr && verbose_env[0] != '\0' && verbose_env[0] != '0' && rank == 0;

  // The golden data itself must exercise both outcomes, or the clip_coef checks prove nothing.
  int clipped_steps = 0, unclipped_steps = 0, uncalled_steps = 0;
  for (const GoldenClipCase& c : cases) {
    for (const GoldenClipStep& s : c.clip) {
      if (!s.called) ++uncalled_steps;
      else if (static_cast<double>(s.total_norm) > s.max_norm) ++clipped_steps;
      else ++unclipped_steps;
    }
  }
  CHECK(clipped_steps > 0);
  CHECK(unclipped_steps > 0);
  CHECK(uncalled_steps > 0);

  for (const GoldenClipCase& c : cases) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      std::vector<Storage> storages{Storage::bucket_view};
      // One case also through the caller's own buffers: the same update, copied in and out.
      if (&c == &cases.front()) storages.push_back(Storage::external);
      for (Storage storage : storages) {
        const std::string label = fmt::format("{} [{}, {}, np {}]", c.golden.name, partition_name(partition),
                                              storage == Storage::external ? "external" : "bucket_view",
                                              world_size);
        Run run;
        try {
          run = replay(c, partition, storage);
        } catch (const std::exception& e) {
          // Deterministic on every rank (same data, same layout); record it and go on, so one
          // broken case does not hide the others.
          FAIL_CHECK(label << ": " << e.what());
          continue;
        }
        const std::string rank_difference = differences_from_rank0(run.record);
        INFO(label << " (" << c.golden.file << "): " << run.cmp.summary() << "\n" << run.cmp.failures << run.problems
                   << rank_difference);
        CHECK(run.cmp.checked > 0);
        CHECK(run.cmp.out_of_tolerance == 0);
        CHECK(run.problems.empty());
        CHECK(rank_difference.empty());
        if (verbose) std::printf("[clip] %-52s %s\n", label.c_str(), run.cmp.summary().c_str());
      }
    }
  }
}

TEST_CASE("clip_grad_norm rejects an unsupported norm_type and a negative or NaN max_norm",
          "[parity][clip]") {
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  ParamGroupSpec group;
  group.hyper.lr = 0.1;
  const std::vector<float> init = shardopt_test::seeded_values(7, 13);
  std::vector<float> initial_values = init;  // bucket view copies these into its own buffer
  ParamSpec p;
  p.name = "w";
  p.param = TensorRef{initial_values.data(), static_cast<int64_t>(init.size()), DType::f32, Device::cpu()};
  group.params.push_back(p);
  ZeroOptimizer opt(shardopt_test::world(), config, {group});
  const ParamId id = opt.find_param("w");
  const std::vector<float> grad = shardopt_test::seeded_values(8, 13, 10.f);
  std::copy(grad.begin(), grad.end(), shardopt_parity::floats_of(opt.grad_view(id), grad.size(), "grad_view(w)"));

  struct Bad {
    double max_norm;
    double norm_type;
    const char* named;  // what the message must contain (lower case)
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Bad& bad : {Bad{1.0, 1.5, "1.5"}, Bad{-2.0, 2.0, "-2"}, Bad{nan, 2.0, "nan"},
                         Bad{-0.5, std::numeric_limits<double>::infinity(), "-0.5"}}) {
    INFO("clip_grad_norm(" << bad.max_norm << ", " << bad.norm_type << ")");
    const auto error = shardopt_test::error_of([&] { opt.clip_grad_norm(bad.max_norm, bad.norm_type); });
    CHECK(error.first == ErrorCode::invalid_argument);
    INFO("message: " << error.second);
    CHECK(lower(error.second).find(bad.named) != std::string::npos);
  }

  // A rejected call leaves no factor behind: the next step is an ordinary, unclipped one (the
  // gradient's norm is ~20, far above the max_norm 1.0 of the first rejected call).
  opt.step();
  CHECK(opt.last_step().grad_norm == -1.0);
  CHECK(opt.last_step().clip_coef == 1.0);
  const float* w = shardopt_parity::floats_of(opt.param_view(id), init.size(), "param_view(w)");
  std::vector<float> expected(init.size());
  for (std::size_t i = 0; i < init.size(); ++i) expected[i] = init[i] - 0.1f * grad[i];
  Comparison cmp;
  cmp.add("w after the unclipped step", w, expected);
  INFO(cmp.summary() << "\n" << cmp.failures);
  CHECK(cmp.out_of_tolerance == 0);
}
