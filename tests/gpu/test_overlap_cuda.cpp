// tests/gpu/test_overlap_cuda.cpp — config.overlap on CUDA parameters at one rank, over NCCL and over MPI: bitwise the plain step for both stages, both policies, f32 and bf16, with parameters read on cuda_stream() after wait_param.
//
// Runs as its own Catch2 runner. Skips (exit 77) with one line without a usable device. The
// CPU tests (tests/mpi/test_device_overlap.cpp) run the same engine on a counting host
// implementation of the device operations at 1 to 3 ranks; this one runs it on the device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "precision.hpp"  // kernels/: float -> bf16 (nearest even)
#include "shardopt/nccl.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::DeviceArray;

std::shared_ptr<Communicator>& host_world() {
  static std::shared_ptr<Communicator> comm;
  return comm;
}
std::shared_ptr<Communicator>& nccl() {  // null when the build has no NCCL
  static std::shared_ptr<Communicator> comm;
  return comm;
}

// Several buckets of 64 f32 (128 bf16) elements, some params spanning two.
const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};
constexpr int kSteps = 3;

// Seeded values as `dtype`'s bytes.
std::vector<uint8_t> seeded_bytes(uint32_t seed, int64_t n, DType dtype) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const float x = dist(gen);
    if (dtype == DType::f32) {
      uint8_t b[4];
      std::memcpy(b, &x, 4);
      out.insert(out.end(), b, b + 4);
    } else {
      const uint16_t h = kernels::float_to_bf16(x);
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
  }
  return out;
}

void copy_in(void* device_dst, const std::vector<uint8_t>& bytes, void* stream) {
  if (bytes.empty()) return;
  const auto s = static_cast<cudaStream_t>(stream);
  REQUIRE(cudaMemcpyAsync(device_dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);  // `bytes` may go away after we return
}

struct Case {
  int stage = 1;
  DType dtype = DType::f32;
  OverlapPolicy overlap = OverlapPolicy::after_backward;
};

// Trains kSteps on `comm` and returns every parameter's bytes after each step, read on
// cuda_stream() after wait_param (the documented order: no host wait needed in between).
std::vector<std::vector<uint8_t>> train(const std::shared_ptr<Communicator>& comm, const Case& c, OverlapPolicy overlap,
                                        Device device) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.stage = c.stage;
  config.bucket_bytes = 256;
  config.overlap = overlap;
  config.stochastic_rounding = c.dtype == DType::bf16;
  config.rounding_seed = 3;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> initial;
  ParamGroupSpec group;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    const std::vector<uint8_t> values = seeded_bytes(10u + static_cast<uint32_t>(i), kSizes[i], c.dtype);
    initial.push_back(std::make_unique<DeviceArray<uint8_t>>(values.size()));
    initial.back()->upload(values);
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{initial.back()->data(), kSizes[i], c.dtype, device};
    group.params.push_back(p);
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  ZeroOptimizer opt(comm, config, {group});
  void* stream = opt.cuda_stream();
  REQUIRE(stream != nullptr);
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> grads;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    grads.push_back(std::make_unique<DeviceArray<uint8_t>>(static_cast<std::size_t>(opt.param_view(static_cast<ParamId>(i)).nbytes())));
  }
  std::vector<std::vector<uint8_t>> after_each_step;
  for (int s = 0; s < kSteps; ++s) {
    // Backward order; stage 1 alternates gradients written into grad_view (grad_ready) and
    // handed from the caller's buffer (reduce_gradient), as the plain run reads them.
    for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
      const std::vector<uint8_t> g = seeded_bytes(1000u + static_cast<uint32_t>(s * 13 + i), kSizes[static_cast<std::size_t>(i)], c.dtype);
      const bool in_view = c.stage == 1 && (overlap == OverlapPolicy::off || i % 2 == 0);
      if (in_view) {
        copy_in(opt.grad_view(i).data, g, stream);
        if (overlap != OverlapPolicy::off) opt.grad_ready(i);
      } else {
        copy_in(grads[static_cast<std::size_t>(i)]->data(), g, stream);
        opt.reduce_gradient(i, TensorRef{grads[static_cast<std::size_t>(i)]->data(), kSizes[static_cast<std::size_t>(i)], c.dtype, device});
      }
    }
    opt.reduce_gradients();
    opt.step();
    std::vector<uint8_t> bytes;
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      opt.wait_param(id);
      const TensorRef v = opt.param_view(id);
      std::vector<uint8_t> host(static_cast<std::size_t>(v.nbytes()));
      REQUIRE(cudaMemcpyAsync(host.data(), v.data, host.size(), cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(stream)) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess);
      bytes.insert(bytes.end(), host.begin(), host.end());
    }
    after_each_step.push_back(std::move(bytes));
  }
  opt.wait_all();
  return after_each_step;
}

void check_overlap_on(const std::shared_ptr<Communicator>& comm, Device device) {
  for (int stage : {1, 2}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
        Case c;
        c.stage = stage;
        c.dtype = dtype;
        c.overlap = overlap;
        INFO(comm->backend_name() << ", stage " << stage << ", " << dtype_name(dtype) << ", "
                                  << overlap_policy_name(overlap));
        const std::vector<std::vector<uint8_t>> plain = train(comm, c, OverlapPolicy::off, device);
        const std::vector<std::vector<uint8_t>> overlapped = train(comm, c, overlap, device);
        REQUIRE(plain.size() == overlapped.size());
        for (std::size_t s = 0; s < plain.size(); ++s) {
          INFO("step " << s);
          REQUIRE(plain[s].size() == overlapped[s].size());
          CHECK(std::memcmp(plain[s].data(), overlapped[s].data(), plain[s].size()) == 0);
        }
        CHECK(plain.front() != plain.back());  // the steps changed the parameters
      }
    }
  }
}

}  // namespace

TEST_CASE("overlap over NCCL on CUDA parameters is bitwise the plain step", "[gpu][overlap]") {
  if (!nccl()) {
    SUCCEED("this build has no NCCL");
    return;
  }
  check_overlap_on(nccl(), nccl()->device());
}

TEST_CASE("overlap over a one-rank MPI communicator on CUDA parameters is bitwise the plain step", "[gpu][overlap]") {
  check_overlap_on(host_world(), Device::cuda(0));
}

int main(int argc, char** argv) {
  CommOptions options;
  options.timeout_seconds = 60;
  host_world() = mpi_world(options);
  std::string reason;
  if (!shardopt_test::cuda_device_present(&reason)) {
    std::printf("SKIPPED: no CUDA device: %s\n", reason.c_str());
    host_world().reset();
    return shardopt_test::kSkipExitCode;
  }
  if (cudaSetDevice(0) != cudaSuccess) std::printf("cudaSetDevice(0) failed\n");
  if (nccl_compiled_in()) nccl() = nccl_world(options);
  const int failed = Catch::Session().run(argc, argv);
  nccl().reset();
  host_world().reset();
  return failed > 0 ? 1 : 0;
}
