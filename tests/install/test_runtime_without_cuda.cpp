// tests/install/test_runtime_without_cuda.cpp — a program linked to libshardopt alone runs a CPU step, and asking for a CUDA device or NCCL where the driver or NCCL is missing gives an Error that says what is missing.
//
//   test_runtime_without_cuda missing-nccl   (SHARDOPT_NCCL_LIBRARY names a file that does not exist)
//   test_runtime_without_cuda system-nccl    (NCCL as the loader finds it, where it is installed)
//
// The program links the shared library only (no CUDA runtime, no NCCL, no internals), so it
// loads wherever libshardopt loads. SHARDOPT_TEST_HAVE_CUDA (0/1, from CMake) says whether the
// library was built with CUDA. Prints what it checked; exits 1 on any wrong answer.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/nccl.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// Whether `library` can be loaded here (what shardopt will find when it tries).
bool loadable(const char* library) {
  void* handle = dlopen(library, RTLD_LAZY | RTLD_LOCAL);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

template <typename Call>
std::pair<ErrorCode, std::string> error_of(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {static_cast<ErrorCode>(0), ""};  // no error
}

// SGD with lr 0.5 on the caller's buffers: w - 0.5 * g, exact in float for these values.
void check_cpu_step(const std::shared_ptr<Communicator>& comm) {
  std::vector<float> w{1.f, 2.f, 3.f, 4.f, 5.f}, g{0.5f, -1.f, 2.f, 0.25f, 0.f};
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  config.storage = Storage::external;
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"w", TensorRef{w.data(), 5}, TensorRef{g.data(), 5}});
  group.hyper.lr = 0.5;
  ZeroOptimizer opt(comm, config, {group});
  opt.step();
  const std::vector<float> expected{0.75f, 2.5f, 2.f, 3.875f, 5.f};
  expect(std::memcmp(w.data(), expected.data(), sizeof(float) * 5) == 0, "a CPU SGD step gives w - lr * g bitwise");
}

void check_cuda_request(const std::shared_ptr<Communicator>& comm) {
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"w", TensorRef{nullptr, 8, DType::f32, Device::cuda(0)}, {}});
  const auto [code, what] = error_of([&] { ZeroOptimizer(comm, OptimizerConfig{}, {group}); });
  std::printf("cuda:0 -> %s\n", what.c_str());
  if (!SHARDOPT_TEST_HAVE_CUDA) {
    expect(code == ErrorCode::unsupported && contains(what, "this build has no CUDA support"),
           "a CPU-only build says it has no CUDA support");
  } else if (!loadable("libcuda.so.1")) {
    expect(code == ErrorCode::cuda && contains(what, "parameter 'w' is on cuda:0") &&
               contains(what, "no CUDA driver on this machine") && contains(what, "libcuda.so.1"),
           "a CUDA build without a driver names the missing libcuda.so.1");
  } else {
    std::printf("skipped: this machine has a CUDA driver\n");
  }
}

void check_nccl(bool missing) {
  CommOptions options;
  options.timeout_seconds = 10;
  const auto [code, what] = error_of([&] { nccl_world(options); });
  std::printf("nccl_world -> %s\n", what.empty() ? "a communicator" : what.c_str());
  if (!nccl_compiled_in()) {
    expect(code == ErrorCode::unsupported && contains(what, "has no NCCL backend"),
           "a build without NCCL says so");
  } else if (missing) {
    expect(code == ErrorCode::unsupported && contains(what, "nccl_world: NCCL cannot be loaded") &&
               contains(what, "/nonexistent/libnccl.so.2") && contains(what, "SHARDOPT_NCCL_LIBRARY"),
           "a missing NCCL is named, with the dlopen error and what to do");
  } else if (loadable("libnccl.so.2")) {
    // The library loads and every function shardopt uses resolves; what fails after that (no
    // device here) is not about loading NCCL.
    expect(!contains(what, "NCCL cannot be loaded"), "the installed libnccl.so.2 has every function shardopt uses");
    if (!loadable("libcuda.so.1")) {
      expect(code == ErrorCode::cuda && contains(what, "no CUDA driver on this machine"),
             "nccl_world without a driver names the missing driver");
    }
  } else {
    std::printf("skipped: no libnccl.so.2 on this machine\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "missing-nccl" && mode != "system-nccl") {
    std::fprintf(stderr, "usage: %s missing-nccl|system-nccl\n", argv[0]);
    return 2;
  }
  CommOptions options;
  options.timeout_seconds = 10;
  const std::shared_ptr<Communicator> comm = mpi_world(options);
  check_cpu_step(comm);
  check_cuda_request(comm);
  check_nccl(mode == "missing-nccl");
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
