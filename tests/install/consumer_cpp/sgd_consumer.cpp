// tests/install/consumer_cpp/sgd_consumer.cpp — a C++17 user of the installed C++ API: a sharded SGD-momentum step checked by value, and shardopt::Error caught across the library boundary.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <shardopt/shardopt.hpp>

int main() {
  auto comm = shardopt::mpi_world();
  const int rank = comm->rank();
  shardopt::OptimizerConfig config;
  config.algorithm = shardopt::Algorithm::sgd;
  shardopt::ParamGroupSpec group;
  group.hyper.lr = 0.1;
  group.hyper.momentum = 0.9;
  std::vector<float> weights(101, 1.0f);
  group.params = {{"weights", {weights.data(), 101}, {}}};
  shardopt::ZeroOptimizer opt(comm, config, {group});

  // Two steps with gradient 1: torch's SGD gives 1 - 0.1 * (1 + 1.9) = 0.71.
  for (int step = 0; step < 2; ++step) {
    shardopt::TensorRef grad = opt.grad_view(0);
    for (int64_t i = 0; i < grad.numel; ++i) grad.as<float>()[i] = 1.0f;
    opt.step();
  }
  const float* w = opt.param_view(0).as<float>();
  for (int i = 0; i < 101; ++i) {
    if (std::fabs(w[i] - 0.71f) > 1e-6f) {
      std::fprintf(stderr, "rank %d: weights[%d] = %.8f, expected 0.71\n", rank, i, w[i]);
      return 1;
    }
  }

  // An exception thrown inside libshardopt is caught here as shardopt::Error with its code.
  try {
    opt.find_param("missing");
    std::fprintf(stderr, "rank %d: find_param(\"missing\") did not throw\n", rank);
    return 1;
  } catch (const shardopt::Error& e) {
    if (e.code() != shardopt::ErrorCode::invalid_argument || std::string(e.what()).find("missing") == std::string::npos) {
      std::fprintf(stderr, "rank %d: unexpected error %s: %s\n", rank, shardopt::error_code_name(e.code()), e.what());
      return 1;
    }
  }
  std::printf("rank %d: shardopt %s C++ API: SGD momentum steps match (%.2f), shardopt::Error caught\n", rank,
              shardopt::version(), w[0]);
  return 0;
}
