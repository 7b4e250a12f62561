// examples/minimal_trainer.cpp — the README's embedding example: a trainer hands shardopt two tensors.
#include <cstdio>
#include <vector>

#include "shardopt/shardopt.hpp"

int main() {
  auto comm = shardopt::mpi_world();  // initialises MPI; or shardopt::mpi_borrow(&my_comm)
  std::vector<float> w(1000, 0.5f), b(10, 0.0f);  // initial values, the same on every rank
  shardopt::OptimizerConfig config;  // Adam, flat partition, bucket view
  shardopt::ParamGroupSpec group;
  group.hyper.lr = 1e-3;
  group.params = {{"fc.weight", {w.data(), 1000}, {}}, {"fc.bias", {b.data(), 10}, {}}};
  shardopt::ZeroOptimizer opt(comm, {group}, config);  // collective: checks registrations agree

  for (int step = 0; step < 3; ++step) {
    for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
      shardopt::TensorRef grad = opt.grad_view(id);  // backward writes here
      for (int64_t i = 0; i < grad.numel; ++i) grad.as<float>()[i] = 0.01f * float(comm->rank() + 1);
    }
    opt.reduce_gradients();  // average over ranks (skip if your trainer has its own DDP)
    opt.step();              // update this rank's shard, then all-gather the parameters
  }
  const float* weights = opt.param_view(0).as<float>();  // identical on every rank
  if (comm->rank() == 0) std::printf("fc.weight[0] = %.6f, state bytes on rank 0: %lld\n", weights[0],
                                     static_cast<long long>(opt.memory_report().state_bytes));
}
