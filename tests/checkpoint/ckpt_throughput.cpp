// tests/checkpoint/ckpt_throughput.cpp — save/load throughput of the tutorial-sized model (20 x Linear(2000, 2000), Adam), by hand under mpiexec.
//
// usage: mpiexec -n N shardopt-ckpt-throughput DIR [layers] [width] [repeats]
// Prints, per repetition, the seconds and MB/s (checkpoint bytes / wall time, all ranks
// together) of save (fsync included) and load (checksums included).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [layers] [width] [repeats]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int layers = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t width = argc > 3 ? std::atoll(argv[3]) : 2000;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  auto comm = mpi_world();
  ParamGroupSpec group;
  for (int l = 0; l < layers; ++l) {
    group.params.push_back(ParamSpec{"layer" + std::to_string(l) + ".weight", TensorRef{nullptr, width * width}, {}});
    group.params.push_back(ParamSpec{"layer" + std::to_string(l) + ".bias", TensorRef{nullptr, width}, {}});
  }
  ZeroOptimizer opt(comm, OptimizerConfig{}, {group});
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    TensorRef g = opt.grad_view(id);
    for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = static_cast<float>((i * 7 + id) % 13) * 0.01f;
  }
  opt.step();  // non-trivial state
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  for (int r = 0; r < repeats; ++r) {
    comm->barrier();
    const auto t0 = clock::now();
    opt.save(dir);
    comm->barrier();
    const auto t1 = clock::now();
    opt.load(dir);
    comm->barrier();
    const auto t2 = clock::now();
    if (comm->rank() == 0) {
      const CheckpointInfo info = read_checkpoint_info(dir);
      const double mb = static_cast<double>(info.file_bytes) / 1e6;
      std::printf("np %d  params %lld  bytes %.1f MB  save %.3f s (%.0f MB/s)  load %.3f s (%.0f MB/s)\n", comm->size(),
                  static_cast<long long>(info.numel), mb, seconds(t0, t1), mb / seconds(t0, t1), seconds(t1, t2),
                  mb / seconds(t1, t2));
    }
  }
  return 0;
}
