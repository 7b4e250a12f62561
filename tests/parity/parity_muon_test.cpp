// tests/parity/parity_muon_test.cpp — Muon against torch.optim.Muon's golden trajectories (tools/gen_golden_muon.py): the CPU kernel alone, and a ZeroOptimizer owning the matrices whole.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpu/muon_cpu.hpp"
#include "mpi/mpi_test_support.hpp"

namespace {

using json = nlohmann::json;
using shardopt::MatrixPrecision;

struct MuonCase {
  std::string name;
  int64_t rows = 0, cols = 0;
  shardopt::Hyperparams hyper;
  std::vector<float> init;
  std::vector<std::vector<float>> grads, expected;
  std::vector<float> momentum_buffer;
};

std::vector<float> floats(const json& list) {
  std::vector<float> out;
  for (const json& v : list) out.push_back(std::strtof(v.get<std::string>().c_str(), nullptr));
  return out;
}

std::vector<MuonCase> load_cases(const std::string& precision) {
  // The live test's directory holds what the torch installed here wrote; a torch without
  // torch.optim.Muon (before 2.9) writes no Muon vectors, so those come from the committed ones.
  const char* dir = std::getenv("SHARDOPT_GOLDEN_DIR");
  const std::string name = fmt::format("golden_muon_{}.json", precision);
  std::string path = fmt::format("{}/{}", SHARDOPT_GOLDEN_DIR_DEFAULT, name);
  if (dir != nullptr && std::ifstream(fmt::format("{}/{}", dir, name)).good()) path = fmt::format("{}/{}", dir, name);
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  const json doc = json::parse(in);
  REQUIRE(doc.at("format") == "shardopt-golden-muon-v1");
  REQUIRE(doc.at("precision") == precision);
  std::vector<MuonCase> cases;
  for (const json& c : doc.at("cases")) {
    MuonCase m;
    m.name = c.at("name").get<std::string>();
    m.rows = c.at("shape")[0].get<int64_t>();
    m.cols = c.at("shape")[1].get<int64_t>();
    const json& h = c.at("hyper");
    m.hyper = shardopt::default_hyperparams(shardopt::Algorithm::muon);
    m.hyper.lr = h.at("lr").get<double>();
    m.hyper.weight_decay = h.at("weight_decay").get<double>();
    m.hyper.momentum = h.at("momentum").get<double>();
    m.hyper.eps = h.at("eps").get<double>();
    m.hyper.ns_steps = h.at("ns_steps").get<int32_t>();
    for (std::size_t i = 0; i < 3; ++i) m.hyper.ns_coefficients[i] = h.at("ns_coefficients")[i].get<double>();
    m.hyper.nesterov = h.at("nesterov").get<bool>();
    const json& adjust = h.at("adjust_lr_fn");
    m.hyper.adjust_lr_fn = adjust.is_null()                 ? shardopt::MuonLrAdjust::none
                           : adjust == "original"           ? shardopt::MuonLrAdjust::original
                           : adjust == "match_rms_adamw"    ? shardopt::MuonLrAdjust::match_rms_adamw
                                                            : shardopt::MuonLrAdjust::spectral_unclamped;
    m.init = floats(c.at("init"));
    for (const json& g : c.at("grads")) m.grads.push_back(floats(g));
    for (const json& e : c.at("expected")) m.expected.push_back(floats(e));
    m.momentum_buffer = floats(c.at("momentum_buffer"));
    cases.push_back(std::move(m));
  }
  REQUIRE(cases.size() == 24);  // 3 shapes x nesterov on/off x 4 adjust_lr_fn
  return cases;
}

// How far `got` may be from torch's `want` after `steps` steps. f32: 1e-5 relative (and 1e-6
// absolute near zero). bf16: torch orthogonalises a bf16 copy; where its GEMMs sum in another
// order than OpenBLAS, a bf16 rounding may go the other way, so each step's update may differ
// by a bf16 ulp-scale amount: a quarter of 2^-8 (bf16's relative step at 1, Newton-Schulz's
// scale) times the step's adjusted lr, per step taken. The fp32 Newton-Schulz fails it (checked
// below), so the bf16 emulation is what passes it.
double tolerance(const MuonCase& c, MatrixPrecision precision, int steps, float want) {
  if (precision == MatrixPrecision::f32) return 1e-5 * std::fabs(want) + 1e-6;
  const double lr = shardopt::kernels::muon_adjusted_lr(c.hyper.lr, static_cast<int>(c.hyper.adjust_lr_fn), c.rows,
                                                        c.cols);
  return steps * lr * 0.25 / 256.0;
}

struct Worst {
  double excess = 0.0;  // largest |got - want| / tolerance seen
  std::string where;
  void check(const std::vector<float>& got, const std::vector<float>& want, const MuonCase& c, MatrixPrecision p,
             int steps, const std::string& what) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double ratio = std::fabs(static_cast<double>(got[i]) - want[i]) / tolerance(c, p, steps, want[i]);
      if (!(ratio <= excess)) {
        excess = ratio;
        where = fmt::format("{} {} [{}]: {} vs torch {}", c.name, what, i, got[i], want[i]);
      }
    }
  }
};

shardopt::kernels::MuonPrecision kernel_precision(MatrixPrecision p) {
  return p == MatrixPrecision::f32 ? shardopt::kernels::MuonPrecision::f32 : shardopt::kernels::MuonPrecision::bf16;
}

// The kernel in `precision` over the golden trajectories of `reference` (torch's bf16 Muon or
// the fp32 one), judged by `reference`'s tolerance.
Worst kernel_errors(MatrixPrecision precision, MatrixPrecision reference) {
  const std::vector<MuonCase> cases = load_cases(reference == MatrixPrecision::f32 ? "f32" : "bf16");
  Worst worst;
  shardopt::kernels::MuonWorkspace ws;
  for (const MuonCase& c : cases) {
    std::vector<float> param = c.init;
    std::vector<float> buf(param.size(), 0.f);
    const shardopt::Hyperparams& h = c.hyper;
    const auto s = shardopt::kernels::make_muon_scalars(h.lr, h.weight_decay, h.momentum, h.nesterov, h.ns_coefficients,
                                                        h.ns_steps, h.eps, static_cast<int>(h.adjust_lr_fn), c.rows,
                                                        c.cols);
    for (std::size_t k = 0; k < c.grads.size(); ++k) {
      shardopt::kernels::UpdateTensors t;
      t.param = param.data();
      t.grad = c.grads[k].data();
      shardopt::kernels::muon_update_cpu(t, buf.data(), c.rows, c.cols, s, {}, {}, kernel_precision(precision), 1, ws);
      worst.check(param, c.expected[k], c, reference, static_cast<int>(k) + 1, fmt::format("step {}", k + 1));
    }
    // The momentum buffer is elementwise fp32 arithmetic on both sides.
    for (std::size_t i = 0; i < buf.size(); ++i) REQUIRE(std::fabs(buf[i] - c.momentum_buffer[i]) <= 1e-6f);
  }
  return worst;
}

void kernel_parity(MatrixPrecision precision) {
  const Worst worst = kernel_errors(precision, precision);
  INFO("worst: " << worst.where << " (" << worst.excess << " of the tolerance)");
  if (shardopt_test::world()->rank() == 0) {
    std::printf("muon %s kernel parity: worst error %.3f of the tolerance (%s)\n",
                precision == MatrixPrecision::f32 ? "f32" : "bf16", worst.excess, worst.where.c_str());
  }
  CHECK(worst.excess <= 1.0);
}

// One optimizer per (nesterov, adjust_lr_fn): the three shapes as one Muon group, owned whole
// by the ranks (at 3 ranks one each), stepped through the golden gradients.
void optimizer_parity(MatrixPrecision precision, int stage) {
  const std::vector<MuonCase> cases = load_cases(precision == MatrixPrecision::f32 ? "f32" : "bf16");
  Worst worst;
  // Cases are ordered shape-major: the same hyperparameters recur every 8 cases.
  for (std::size_t first = 0; first < 8; ++first) {
    const std::vector<const MuonCase*> trio = {&cases[first], &cases[first + 8], &cases[first + 16]};
    shardopt::ParamGroupSpec group;
    group.settings.algorithm = shardopt::Algorithm::muon;
    group.hyper = trio[0]->hyper;
    for (const MuonCase* c : trio) {
      shardopt::ParamSpec p;
      p.name = c->name;
      p.param = shardopt::TensorRef{const_cast<float*>(c->init.data()), c->rows * c->cols, shardopt::DType::f32};
      p.shape = {c->rows, c->cols};
      group.params.push_back(p);
    }
    shardopt::OptimizerConfig config;
    config.muon.precision = precision;
    config.stage = stage;
    shardopt::ZeroOptimizer opt(shardopt_test::world(), {group}, config);
    for (std::size_t k = 0; k < trio[0]->grads.size(); ++k) {
      shardopt_test::hand_gradients_backward(opt, stage, [&](shardopt::ParamId id) {
        return trio[static_cast<std::size_t>(id)]->grads[k];
      });
      opt.reduce_gradients();
      opt.step();
      for (shardopt::ParamId id = 0; id < 3; ++id) {
        const shardopt::TensorRef v = opt.param_view(id);
        const std::vector<float> got(v.as<float>(), v.as<float>() + v.numel);
        const MuonCase& c = *trio[static_cast<std::size_t>(id)];
        worst.check(got, c.expected[k], c, precision, static_cast<int>(k) + 1, fmt::format("optimizer step {}", k + 1));
      }
    }
  }
  INFO("worst: " << worst.where << " (" << worst.excess << " of the tolerance)");
  CHECK(worst.excess <= 1.0);
}

}  // namespace

TEST_CASE("Muon's CPU kernel matches torch's fp32 Newton-Schulz reference within 1e-5 relative", "[parity][muon]") {
  kernel_parity(MatrixPrecision::f32);
}

TEST_CASE("Muon's CPU kernel in bf16 matches torch.optim.Muon within bf16's tolerance", "[parity][muon]") {
  kernel_parity(MatrixPrecision::bf16);
  // The tolerance tells the precisions apart: fp32 Newton-Schulz is outside it.
  const Worst f32_against_bf16 = kernel_errors(MatrixPrecision::f32, MatrixPrecision::bf16);
  if (shardopt_test::world()->rank() == 0) {
    std::printf("muon f32 kernel against torch's bf16 Muon: worst error %.3f of the bf16 tolerance\n",
                f32_against_bf16.excess);
  }
  CHECK(f32_against_bf16.excess > 1.0);
}

TEST_CASE("A ZeroOptimizer with a Muon group matches torch.optim.Muon at any world size", "[parity][muon]") {
  for (int stage : {1, 2}) {
    optimizer_parity(MatrixPrecision::f32, stage);
    optimizer_parity(MatrixPrecision::bf16, stage);
  }
}
