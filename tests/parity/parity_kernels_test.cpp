// tests/parity/parity_kernels_test.cpp — the CPU update kernels replayed over torch.optim's golden trajectories.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpu/update_cpu.hpp"
#include "golden_data.hpp"
#include "mpi/mpi_test_support.hpp"
#include "update_rules.hpp"

namespace {

using shardopt::Algorithm;
using shardopt_parity::Comparison;
using shardopt_parity::GoldenCase;
using shardopt_parity::GoldenGroup;

bool verbose() {
  const char* env = std::getenv("SHARDOPT_PARITY_VERBOSE");
  return env != nullptr && env[0] != '\0' && env[0] != '0' && shardopt_test::world()->rank() == 0;
}

// Runs one group as one contiguous run (as a shard holding the whole group would), with its own
// state, and compares each param's slice after every step.
Comparison replay_group(const GoldenCase& c, int group_index) {
  const GoldenGroup& group = c.groups[static_cast<std::size_t>(group_index)];
  std::vector<std::size_t> offsets;
  std::vector<float> param;
  for (int i : group.params) {
    offsets.push_back(param.size());
    const std::vector<float>& init = c.params[static_cast<std::size_t>(i)].init;
    param.insert(param.end(), init.begin(), init.end());
  }
  const std::size_t n = param.size();
  std::vector<float> grad(n), state_a(n, 0.f), state_b(n, 0.f), state_max(n, 0.f);
  // torch keeps the momentum buffer from the first step taken with momentum != 0 onwards, even
  // through later steps with momentum 0; until then a momentum step clones d_p into it.
  bool has_momentum_buffer = false;

  Comparison cmp;
  for (int k = 0; k < c.steps; ++k) {
    const shardopt::Hyperparams& h = group.hyper_per_step[static_cast<std::size_t>(k)];
    for (std::size_t j = 0; j < group.params.size(); ++j) {
      const std::vector<float>& g = c.grads[static_cast<std::size_t>(k)][static_cast<std::size_t>(group.params[j])];
      std::copy(g.begin(), g.end(), grad.begin() + static_cast<std::ptrdiff_t>(offsets[j]));
    }
    if (c.algorithm == Algorithm::sgd) {
      const auto s = shardopt::kernels::make_sgd_scalars(h.lr, h.momentum, h.dampening, h.weight_decay,
                                                         h.nesterov, h.maximize, !has_momentum_buffer);
      shardopt::kernels::sgd_update_cpu(param.data(), grad.data(), state_a.data(), static_cast<int64_t>(n), s, 1);
      has_momentum_buffer = has_momentum_buffer || h.momentum != 0.0;
    } else {
      const auto s = shardopt::kernels::make_adam_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                                                          c.algorithm == Algorithm::adamw, h.amsgrad,
                                                          h.maximize, k + 1);
      shardopt::kernels::adam_update_cpu(param.data(), grad.data(), state_a.data(), state_b.data(),
                                         state_max.data(), static_cast<int64_t>(n), s, 1);
    }
    for (std::size_t j = 0; j < group.params.size(); ++j) {
      const std::size_t i = static_cast<std::size_t>(group.params[j]);
      cmp.add(fmt::format("step {} {}", k + 1, c.params[i].name), param.data() + offsets[j],
              c.expected[static_cast<std::size_t>(k)][i]);
    }
  }
  return cmp;
}

}  // namespace

TEST_CASE("CPU update kernels reproduce torch.optim's golden trajectories", "[parity][kernels]") {
  const std::string dir = shardopt_parity::golden_dir();
  INFO("golden data: " << dir);
  const std::vector<GoldenCase> cases = shardopt_parity::load_golden_cases(dir);
  REQUIRE(!cases.empty());

  for (const GoldenCase& c : cases) {
    Comparison cmp;
    for (int g = 0; g < static_cast<int>(c.groups.size()); ++g) cmp.merge(replay_group(c, g));
    int64_t expected_values = 0;
    for (const auto& tensors : c.expected) {
      for (const auto& t : tensors) expected_values += static_cast<int64_t>(t.size());
    }
    INFO("case " << c.name << " (" << c.file << "): " << cmp.summary() << "\n" << cmp.failures);
    CHECK(cmp.checked == expected_values);
    CHECK(cmp.out_of_tolerance == 0);
    if (verbose()) std::printf("[kernels] %-26s %s\n", c.name.c_str(), cmp.summary().c_str());
  }
}

TEST_CASE("golden data covers SGD, Adam and AdamW", "[parity]") {
  const std::vector<GoldenCase> cases = shardopt_parity::load_golden_cases(shardopt_parity::golden_dir());
  int per_algorithm[3] = {0, 0, 0};
  for (const GoldenCase& c : cases) ++per_algorithm[static_cast<int>(c.algorithm)];
  CHECK(per_algorithm[static_cast<int>(Algorithm::sgd)] > 0);
  CHECK(per_algorithm[static_cast<int>(Algorithm::adam)] > 0);
  CHECK(per_algorithm[static_cast<int>(Algorithm::adamw)] > 0);
}
