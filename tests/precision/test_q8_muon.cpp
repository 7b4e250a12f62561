// tests/precision/test_q8_muon.cpp — 8-bit AdamW groups beside a Muon group: Muon's momentum at its run's moment offset (bitwise as beside fp32 groups), N ranks equal one (Muon + q8 or remainder16 refusals: test_q8_optimizer.cpp).
#include <catch2/catch.hpp>

#include <cstring>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mpi/mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::world;

// AdamW params first (so the Muon matrix's shard offset and moment offset differ once they are
// 8-bit), then a Muon matrix of 64 x 80, then an AdamW param under min_8bit_size.
struct Model {
  std::vector<std::vector<float>> values;
  Model() {
    for (uint32_t i = 0; i < 4; ++i) values.push_back(shardopt_test::seeded_values(70 + i, kSizes[i]));
  }
  static constexpr int64_t kSizes[4] = {5000, 4096, 64 * 80, 300};
};

std::unique_ptr<ZeroOptimizer> make(std::shared_ptr<Communicator> comm, Model& m, StatePrecision adamw_precision) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = PartitionStrategy::sorted_greedy;
  config.state_precision = adamw_precision;
  std::vector<ParamGroupSpec> groups(2);
  for (int i : {0, 1, 3}) {
    groups[0].params.push_back(ParamSpec{"p" + std::to_string(i),
                                         TensorRef{m.values[static_cast<std::size_t>(i)].data(), Model::kSizes[i],
                                                   DType::f32, Device::cpu()},
                                         TensorRef{}});
  }
  groups[0].hyper.lr = 1e-2;
  ParamSpec matrix{"p2", TensorRef{m.values[2].data(), Model::kSizes[2], DType::f32, Device::cpu()}, TensorRef{}};
  matrix.shape = {64, 80};
  groups[1].params.push_back(matrix);
  groups[1].settings.algorithm = Algorithm::muon;
  groups[1].settings.state_precision = StatePrecision::fp32;
  groups[1].hyper.lr = 2e-2;
  return std::make_unique<ZeroOptimizer>(comm, config, groups);
}

// Three steps on a power-of-two grid of gradients (sums over up to 4 ranks exact); every
// parameter's bytes by name afterwards.
std::vector<std::vector<float>> train(ZeroOptimizer& opt) {
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    for (int i = 0; i < 4; ++i) {
      const ParamId id = opt.find_param("p" + std::to_string(i));
      const TensorRef g = opt.grad_view(id);
      const std::vector<float> v = shardopt_test::seeded_values(static_cast<uint32_t>(900 + 10 * step + i), g.numel);
      float* out = static_cast<float*>(g.data);
      for (int64_t k = 0; k < g.numel; ++k) out[k] = static_cast<float>(static_cast<int>(v[k] * 16.f)) / 128.f;
    }
    opt.reduce_gradients();
    opt.step();
  }
  std::vector<std::vector<float>> out;
  for (int i = 0; i < 4; ++i) {
    const TensorRef v = opt.param_view(opt.find_param("p" + std::to_string(i)));
    const float* p = static_cast<const float*>(v.data);
    out.emplace_back(p, p + v.numel);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("q8 AdamW groups beside a Muon group: Muon's bits as beside fp32 ones, N ranks as one", "[q8][muon]") {
  Model a, b, c;
  auto q8 = make(world(), a, StatePrecision::q8);
  auto fp32 = make(world(), b, StatePrecision::fp32);
  auto solo = make(world()->split(world()->rank(), 0), c, StatePrecision::q8);
  const auto with_q8 = train(*q8);
  const auto with_fp32 = train(*fp32);
  const auto one_rank = train(*solo);
  CHECK(same_bits(with_q8[2], with_fp32[2]));  // the Muon matrix does not see its neighbours' precision
  CHECK(!same_bits(with_q8[0], with_fp32[0]));  // while the 8-bit AdamW param does
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(same_bits(with_q8[i], one_rank[i]));
  }
}
