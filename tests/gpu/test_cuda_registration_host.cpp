// tests/gpu/test_cuda_registration_host.cpp — registering CUDA parameters where they cannot be used fails cleanly on every rank (no GPU needed).
//
// Runs under mpiexec in every build. Without CUDA in the build the registration is refused
// with Error(unsupported); with CUDA built in but no usable device (no driver, as on the CI
// machines) with Error(cuda) carrying CUDA's reason; on a machine with a device it succeeds on
// one rank, and over several MPI ranks it needs a CUDA-aware MPI. Every rank must raise (the
// runner's final all-reduce would hang or fail otherwise), never crash.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_cuda_support.hpp"
#include "core/device_memory.hpp"
#include "mpi/mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::world;

namespace {

// What this build and machine must do with CUDA parameters.
enum class Expect { no_cuda_build, no_device, works, needs_cuda_aware_mpi };

Expect expectation(const Communicator& comm) {
  if (!device::cuda_compiled_in()) return Expect::no_cuda_build;
  if (!device::unusable_reason(Device::cuda(0)).empty()) return Expect::no_device;
  if (comm.size() == 1) return Expect::works;
  std::string reason;
  return mpi_support::mpi_cuda_aware(&reason) ? Expect::works : Expect::needs_cuda_aware_mpi;
}

ParamGroupSpec cuda_group(const std::vector<std::pair<std::string, int64_t>>& params) {
  ParamGroupSpec group;
  for (const auto& [name, numel] : params) {
    ParamSpec p;
    p.name = name;
    p.param = TensorRef{nullptr, numel, DType::f32, Device::cuda(0)};  // zeros, owned by shardopt
    group.params.push_back(p);
  }
  return group;
}


}  // namespace

TEST_CASE("CUDA parameters are refused cleanly where they cannot be used, on every rank", "[cuda][registration]") {
  const ParamGroupSpec group = cuda_group({{"fc.weight", 10}, {"fc.bias", 3}});
  const Expect expect = expectation(*world());
  CAPTURE(static_cast<int>(expect));
  if (expect == Expect::works) {
    ZeroOptimizer opt(world(), OptimizerConfig{}, {group});
    REQUIRE(opt.param_view(0).device == Device::cuda(0));
    REQUIRE(opt.cuda_stream() != nullptr);
    return;
  }
  const auto [code, what] = shardopt_test::error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {group}); });
  switch (expect) {
    case Expect::no_cuda_build:
      REQUIRE(code == ErrorCode::unsupported);
      REQUIRE_THAT(what, Catch::Contains("parameter 'fc.weight' is on cuda:0") &&
                             Catch::Contains("this build has no CUDA support"));
      break;
    case Expect::no_device: {
      REQUIRE(code == ErrorCode::cuda);
      // CUDA's own words, the parameter and the rank: enough to see what is wrong where.
      const std::string reason = device::unusable_reason(Device::cuda(0));
      REQUIRE_THAT(what, Catch::Contains("parameter 'fc.weight' is on cuda:0") &&
                             Catch::Contains("rank " + std::to_string(world()->rank())) &&
                             Catch::Contains(reason));
      break;
    }
    case Expect::needs_cuda_aware_mpi:
      REQUIRE(code == ErrorCode::unsupported);
      REQUIRE_THAT(what, Catch::Contains("CUDA-aware") && Catch::Contains("nccl_world"));
      break;
    case Expect::works: break;
  }
  // The communicator is still in step on every rank afterwards.
  float one = 1.f;
  world()->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  REQUIRE(one == static_cast<float>(world()->size()));
}

TEST_CASE("a CUDA parameter on one rank only makes every rank raise, naming that rank", "[cuda][registration]") {
  const int n = world()->size();
  if (n < 2) {
    SUCCEED("needs at least 2 ranks");
    return;
  }
  const int odd_one = n - 1;
  std::vector<float> host(6, 1.f);
  ParamGroupSpec group = cuda_group({{"w", 6}});
  if (world()->rank() != odd_one) group.params[0].param = TensorRef{host.data(), 6};
  // A rank whose own registration is fine learns of the other's error through the collective
  // check; with a usable device there is no local error, and the ranks simply disagree.
  const Expect expect = expectation(*world());
  const auto [code, what] = shardopt_test::error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {group}); });
  CAPTURE(what);
  if (expect == Expect::no_cuda_build || expect == Expect::no_device) {
    REQUIRE(code == (expect == Expect::no_cuda_build ? ErrorCode::unsupported : ErrorCode::cuda));
    REQUIRE_THAT(what, Catch::Contains("parameter 'w' is on cuda:0"));
    if (world()->rank() != odd_one) {
      REQUIRE_THAT(what, Catch::Contains("ZeroOptimizer failed on rank " + std::to_string(odd_one)));
    }
  } else {
    REQUIRE((code == ErrorCode::unsupported || code == ErrorCode::mismatch));
  }
}

TEST_CASE("mixing CPU and CUDA parameters is refused by parameter name", "[cuda][registration]") {
  std::vector<float> host(4, 1.f);
  ParamGroupSpec group = cuda_group({{"a", 4}, {"b", 4}});
  group.params[0].param = TensorRef{host.data(), 4};
  const auto [code, what] = shardopt_test::error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {group}); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("parameter 'b' is on cuda:0"));
  if (device::cuda_compiled_in()) {
    REQUIRE_THAT(what, Catch::Contains("but parameter 'a' is on cpu"));
  } else {
    REQUIRE_THAT(what, Catch::Contains("this build has no CUDA support"));
  }
}
