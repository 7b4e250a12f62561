// tests/mpi/overlap_thread_level_test.cpp — config.overlap where the caller initialised MPI with MPI_THREAD_FUNNELED: the constructor raises Error(unsupported) naming the level on every rank, and overlap off still works.
//
// A plain program: it must initialise MPI itself, before shardopt, at a level of its choosing.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int failures = 0;
  const auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "FAIL: %s\n", what.c_str());
      ++failures;
    }
  };
  if (provided >= MPI_THREAD_SERIALIZED) {
    // This MPI gives more than asked: the refusal cannot be provoked; nothing to check.
    std::printf("MPI provides level %d for MPI_THREAD_FUNNELED: skipped\n", provided);
  } else {
    {
      shardopt::CommOptions options;
      options.timeout_seconds = 60;
      MPI_Comm world = MPI_COMM_WORLD;
      auto comm = shardopt::mpi_borrow(&world, options);
      std::vector<float> values(40, 1.f);
      shardopt::ParamGroupSpec group;
      shardopt::ParamSpec p;
      p.name = "w";
      p.param = shardopt::TensorRef{values.data(), 40};
      group.params.push_back(p);
      shardopt::OptimizerConfig config;
      config.overlap = shardopt::OverlapPolicy::per_bucket;
      try {
        shardopt::ZeroOptimizer opt(comm, config, {group});
        expect(false, "an overlapped optimizer was built over MPI_THREAD_FUNNELED");
      } catch (const shardopt::Error& e) {
        const std::string what = e.what();
        std::printf("%s\n", e.what());
        expect(e.code() == shardopt::ErrorCode::unsupported, "the error code is unsupported");
        expect(what.find("MPI_THREAD_SERIALIZED") != std::string::npos &&
                   what.find("provides MPI_THREAD_FUNNELED") != std::string::npos,
               "the message names both levels: " + what);
      }
      config.overlap = shardopt::OverlapPolicy::off;
      shardopt::ZeroOptimizer opt(comm, config, {group});
      for (int id = 0; id < 1; ++id) {
        const shardopt::TensorRef g = opt.grad_view(id);
        for (int64_t i = 0; i < g.numel; ++i) g.as<float>()[i] = 0.5f;
      }
      opt.reduce_gradients();
      opt.step();
      expect(opt.param_view(0).as<float>()[0] < 1.f, "the plain optimizer trains");
    }
  }
  int worst = failures;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
