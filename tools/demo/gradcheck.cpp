// tools/demo/gradcheck.cpp — the gradient check: central differences of the reference loss vs the Mlp's backward.
#include "gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "data.hpp"
#include "mlp.hpp"

namespace shardopt_demo {

using shardopt::Communicator;
using shardopt::DType;

int check_gradients(Communicator& comm, const Options& options) {
  const int rank = comm.rank();
  const int layers = options.layers;
  const int64_t width = options.width;
  const int64_t weight_numel = width * width;

  std::vector<std::vector<float>> weights(layers, std::vector<float>(static_cast<std::size_t>(weight_numel)));
  std::vector<std::vector<float>> biases(layers, std::vector<float>(static_cast<std::size_t>(width)));
  std::vector<std::vector<float>> weight_grads = weights;
  std::vector<std::vector<float>> bias_grads = biases;
  std::vector<LinearTensors> net(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    init_linear(options.seed, l, options.width, weights[l].data(), weight_numel, biases[l].data(), width);
    net[l] = LinearTensors{weights[l].data(), biases[l].data(), weight_grads[l].data(), bias_grads[l].data()};
  }
  std::vector<float> input(static_cast<std::size_t>(options.batch) * width);
  std::vector<float> target(input.size());
  make_batch(options.seed, rank, input, target);

  Mlp mlp(layers, options.width, options.batch);
  const double loss = mlp.forward_backward(net, input.data(), target.data());

  std::vector<std::vector<double>> ref_weights(layers);
  std::vector<std::vector<double>> ref_biases(layers);
  for (int l = 0; l < layers; ++l) {
    ref_weights[l].assign(weights[l].begin(), weights[l].end());
    ref_biases[l].assign(biases[l].begin(), biases[l].end());
  }
  const auto ref = [&] {
    return reference_loss(layers, options.width, options.batch, ref_weights, ref_biases, input, target);
  };
  const double ref_loss = ref();

  // Every element of a small network; an evenly spread sample of a big one.
  const int64_t total = layers * (weight_numel + width);
  const int64_t max_checked = 4096;
  const int64_t stride = std::max<int64_t>(1, total / max_checked);
  std::vector<double> analytic;
  std::vector<double> numeric;
  int64_t index = 0;
  const auto probe = [&](double& value, float grad) {
    if (index++ % stride != 0) return;
    const double saved = value;
    const double h = 1e-6 * std::max(1.0, std::abs(saved));
    value = saved + h;
    const double up = ref();
    value = saved - h;
    const double down = ref();
    value = saved;
    analytic.push_back(grad);
    numeric.push_back((up - down) / (2.0 * h));
  };
  for (int l = 0; l < layers; ++l) {
    for (int64_t i = 0; i < weight_numel; ++i) probe(ref_weights[l][i], weight_grads[l][i]);
    for (int64_t i = 0; i < width; ++i) probe(ref_biases[l][i], bias_grads[l][i]);
  }

  double largest = 0.0;
  for (const double g : numeric) largest = std::max(largest, std::abs(g));
  const double floor = std::max(1e-3 * largest, std::numeric_limits<double>::min());
  double max_rel_err = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double scale = std::max({std::abs(analytic[i]), std::abs(numeric[i]), floor});
    max_rel_err = std::max(max_rel_err, std::abs(analytic[i] - numeric[i]) / scale);
  }
  const double loss_rel_err = std::abs(loss - ref_loss) / std::max(std::abs(ref_loss), 1e-30);

  // Each rank checked its own batch; report the worst.
  float worst[2] = {static_cast<float>(max_rel_err), static_cast<float>(loss_rel_err)};
  comm.all_reduce(worst, 2, DType::f32, shardopt::ReduceOp::max);
  const double tolerance = 1e-3;
  const bool pass = worst[0] <= tolerance && worst[1] <= tolerance;
  if (rank == 0) {
    std::printf("check_gradients layers=%d width=%d batch=%d checked=%zu max_rel_err=%.3e "
                "loss_rel_err=%.3e tolerance=%.0e result=%s\n",
                layers, options.width, options.batch, numeric.size(), static_cast<double>(worst[0]),
                static_cast<double>(worst[1]), tolerance, pass ? "pass" : "fail");
  }
  return pass ? 0 : 1;
}

}  // namespace shardopt_demo
