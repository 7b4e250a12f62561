// tests/checkpoint/async_save_kill.cpp — the process that async_save_kill_test.sh kills during a background save, and the one that checks what the kill left.
//
//   async_save_kill train DIR   trains 2 steps, save(DIR), writes the parameters to DIR.expected,
//                               trains on, save_async(DIR), steps, wait_save(): killed meanwhile
//                               (SHARDOPT_TEST_PAUSE_ASYNC_SAVE holds the writer where asked)
//   async_save_kill check DIR   loads DIR and prints "resumed bitwise" when the parameters are
//                               DIR.expected's
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

using namespace shardopt;

namespace {

std::vector<float> seeded(uint32_t seed, int64_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

const std::vector<int64_t> kSizes = {4096, 77, 20000, 513};

struct Run {
  std::vector<std::vector<float>> values;
  std::unique_ptr<ZeroOptimizer> opt;
  Run(std::shared_ptr<Communicator> comm, uint32_t seed) {
    ParamGroupSpec group;
    for (std::size_t i = 0; i < kSizes.size(); ++i) values.push_back(seeded(seed + static_cast<uint32_t>(i), kSizes[i]));
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      ParamSpec p;
      p.name = "w" + std::to_string(i);
      p.param = TensorRef{values[i].data(), kSizes[i]};
      group.params.push_back(p);
    }
    opt = std::make_unique<ZeroOptimizer>(comm, OptimizerConfig{}, std::vector<ParamGroupSpec>{group});
  }
  void train(int from, int to) {
    for (int s = from; s < to; ++s) {
      for (ParamId id = 0; id < opt->num_params(); ++id) {
        const TensorRef g = opt->grad_view(id);
        const std::vector<float> v = seeded(900u + static_cast<uint32_t>(s * 13 + id), g.numel);
        std::memcpy(g.data, v.data(), g.nbytes());
      }
      opt->step();
    }
  }
  std::string params() const {
    std::string out;
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      const TensorRef v = opt->param_view(id);
      out.append(static_cast<const char*>(v.data), v.nbytes());
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: async_save_kill train|check DIR\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  CommOptions options;
  options.timeout_seconds = 30;
  auto comm = mpi_world(options);
  try {
    Run run(comm, 3);
    if (mode == "train") {
      run.train(0, 2);
      run.opt->save(dir);
      if (comm->rank() == 0) std::ofstream(dir + ".expected", std::ios::binary) << run.params();
      run.train(2, 4);
      run.opt->save_async(dir);
      run.train(4, 6);
      run.opt->wait_save();
      std::printf("not killed\n");
      return 1;
    }
    run.opt->load(dir);
    std::ifstream in(dir + ".expected", std::ios::binary);
    const std::string expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool same = run.params() == expected && run.opt->param_step(0) == 2;
    if (comm->rank() == 0) std::printf("%s\n", same ? "resumed bitwise" : "resumed other values");
    return same ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm->rank(), e.what());
    return 1;
  }
}
