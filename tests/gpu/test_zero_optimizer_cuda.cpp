// tests/gpu/test_zero_optimizer_cuda.cpp — ZeroOptimizer on CUDA parameters under mpiexec: bitwise equal to the CPU path, on one GPU and sharded over NCCL.
//
// Runs as its own Catch2 runner. Skips (exit 77) without a usable device on every rank, or
// with more ranks on a node than devices. The CPU reference always trains alone (a one-rank
// split), so "GPU over N ranks == CPU on one rank" is checked bitwise: the CUDA update kernels
// are built with --fmad=false and the CPU kernels with -ffp-contract=off.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/mpi/mpi_cuda_support.hpp"
#include "cuda/update_cuda.hpp"
#include "gpu_test_support.hpp"
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
Device& my_device() {
  static Device device = Device::cuda(0);
  return device;
}

std::shared_ptr<Communicator> solo() { return host_world()->split(host_world()->rank(), 0); }

std::vector<float> seeded_values(uint32_t seed, int64_t n, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(gen);
  return values;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A view's values, read or written in the optimizer's stream order wherever the view lives.
void write_view(const TensorRef& view, const std::vector<float>& values, void* stream) {
  REQUIRE(static_cast<int64_t>(values.size()) == view.numel);
  if (view.numel == 0) return;
  if (view.device.is_cpu()) {
    std::memcpy(view.data, values.data(), view.nbytes());
    return;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  REQUIRE(cudaMemcpyAsync(view.data, values.data(), view.nbytes(), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);  // `values` may go away after we return
}
std::vector<float> read_view(const TensorRef& view, void* stream) {
  std::vector<float> values(static_cast<std::size_t>(view.numel));
  if (view.numel == 0) return values;
  if (view.device.is_cpu()) {
    std::memcpy(values.data(), view.data, view.nbytes());
    return values;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  REQUIRE(cudaMemcpyAsync(values.data(), view.data, view.nbytes(), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  return values;
}

std::vector<float> all_params(const ZeroOptimizer& opt) {
  std::vector<float> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const std::vector<float> v = read_view(opt.param_view(id), opt.cuda_stream());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// A model's buffers on the CPU or on a CUDA device: initial values (bucket view) or the
// caller's own param/grad buffers (external storage).
class Model {
 public:
  Model(const std::vector<int64_t>& sizes, Device device, uint32_t seed) : device_(device) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<float> init = seeded_values(seed + static_cast<uint32_t>(i), sizes[i]);
      initial_.push_back(init);
      host_params_.push_back(init);
      host_grads_.emplace_back(init.size(), 0.f);
      if (device.is_cuda()) {
        device_params_.push_back(std::make_unique<DeviceArray<float>>(init.size()));
        device_grads_.push_back(std::make_unique<DeviceArray<float>>(init.size()));
        device_params_.back()->upload(init);
        device_grads_.back()->upload(std::vector<float>(init.size(), 0.f));
      }
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // cudaMemcpy from pageable memory may still be in flight
  }

  ParamGroupSpec group(std::size_t first, std::size_t last, const Hyperparams& hyper, bool external) {
    ParamGroupSpec g;
    g.hyper = hyper;
    for (std::size_t i = first; i < last; ++i) {
      const auto numel = static_cast<int64_t>(initial_[i].size());
      float* param = device_.is_cuda() ? device_params_[i]->data() : host_params_[i].data();
      float* grad = device_.is_cuda() ? device_grads_[i]->data() : host_grads_[i].data();
      ParamSpec p;
      p.name = "p" + std::to_string(i);
      p.param = TensorRef{param, numel, DType::f32, device_};
      if (external) p.grad = TensorRef{grad, numel, DType::f32, device_};
      g.params.push_back(p);
    }
    return g;
  }
  const std::vector<float>& initial(std::size_t i) const { return initial_[i]; }

 private:
  Device device_;
  std::vector<std::vector<float>> initial_, host_params_, host_grads_;
  std::vector<std::unique_ptr<DeviceArray<float>>> device_params_, device_grads_;
};

Hyperparams hyper_for(Algorithm a) {
  Hyperparams h;
  if (a == Algorithm::sgd) {
    h.lr = 0.05;
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
    h.nesterov = false;
  } else {
    h.lr = 0.01;
    h.weight_decay = 0.02;
    h.amsgrad = true;
  }
  return h;
}

// Odd sizes, an empty param, and one large enough for the vector body and several buckets.
const std::vector<int64_t> kSizes = {13, 1, 0, 64, 7, 100, 3, 31, 4099};

// The same training on any communicator and device: two groups, a third added after the first
// step, an LR change, a param frozen midway (re-layout and state migration on the device).
std::vector<float> train(std::shared_ptr<Communicator> comm, OptimizerConfig config, Device device, int steps) {
  const bool external = config.storage == Storage::external;
  Model model(kSizes, device, 42);
  Hyperparams h0 = hyper_for(config.algorithm), h1 = h0, h2 = h0;
  h1.lr *= 0.5;
  h1.maximize = true;
  h2.lr *= 2;
  if (config.algorithm == Algorithm::sgd) {
    h2.nesterov = true;  // torch requires dampening 0 with nesterov
    h2.dampening = 0;
  }
  ZeroOptimizer opt(comm, config, {model.group(0, 5, h0, external), model.group(5, 8, h1, external)});
  for (int s = 0; s < steps; ++s) {
    if (s == 1) opt.add_param_group(model.group(8, kSizes.size(), h2, external));
    if (s == 3) opt.set_trainable(opt.find_param("p3"), false);
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      const TensorRef g = opt.grad_view(id);
      write_view(g, seeded_values(1000u + static_cast<uint32_t>(s * 97 + id), g.numel), opt.cuda_stream());
    }
    if (s == 2) opt.hyperparams(0).lr *= 0.1;
    opt.step();
  }
  return all_params(opt);
}

std::vector<float> concat_initial(const Model& model) {
  std::vector<float> out;
  for (std::size_t i = 0; i < kSizes.size(); ++i) out.insert(out.end(), model.initial(i).begin(), model.initial(i).end());
  return out;
}

template <typename Call>
std::pair<ErrorCode, std::string> error_of(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  FAIL("expected shardopt::Error");
  return {ErrorCode::internal, ""};
}

}  // namespace

TEST_CASE("a step on CUDA parameters is bitwise the CPU step (1 GPU, and sharded over NCCL)", "[gpu][zero]") {
  const std::vector<float> untouched = concat_initial(Model(kSizes, Device::cpu(), 42));
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage storage : {Storage::bucket_view, Storage::external}) {
        CAPTURE(algorithm_name(algorithm), partition_name(partition), static_cast<int>(storage));
        OptimizerConfig config;
        config.algorithm = algorithm;
        config.partition = partition;
        config.storage = storage;
        config.bucket_bytes = 256;  // many buckets even for these small params
        const std::vector<float> cpu = train(solo(), config, Device::cpu(), 6);
        REQUIRE_FALSE(bitwise_equal(cpu, untouched));  // training moved the params at all

        // One GPU, over a one-rank MPI communicator: the optimizer's own stream, no collectives.
        REQUIRE(bitwise_equal(train(solo(), config, my_device(), 6), cpu));
        if (nccl()) {
          // Every rank's GPU: sharded over NCCL when there are several ranks.
          REQUIRE(bitwise_equal(train(nccl(), config, nccl()->device(), 6), cpu));
          config.shard_state = false;
          REQUIRE(bitwise_equal(train(nccl(), config, nccl()->device(), 6), cpu));
        }
      }
    }
  }
}

TEST_CASE("reduce_gradients averages device gradients exactly as the CPU path does", "[gpu][zero]") {
  if (!nccl()) {
    SUCCEED("this build has no NCCL");
    return;
  }
  const int me = host_world()->rank();
  for (Storage storage : {Storage::bucket_view, Storage::external}) {
    CAPTURE(static_cast<int>(storage));
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.storage = storage;
    config.bucket_bytes = 64;
    const bool external = storage == Storage::external;
    Model cpu_model(kSizes, Device::cpu(), 7), gpu_model(kSizes, nccl()->device(), 7);
    ZeroOptimizer cpu(host_world(), config, {cpu_model.group(0, kSizes.size(), Hyperparams{}, external)});
    ZeroOptimizer gpu(nccl(), config, {gpu_model.group(0, kSizes.size(), Hyperparams{}, external)});
    for (ParamId id = 0; id < cpu.num_params(); ++id) {
      // Multiples of 1/64 differing by rank: sums and the division by 2 are exact in any order.
      std::vector<float> grad(static_cast<std::size_t>(kSizes[static_cast<std::size_t>(id)]));
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>((me + 1) * static_cast<int>((i + id) % 13)) / 64.f;
      write_view(cpu.grad_view(id), grad, nullptr);
      write_view(gpu.grad_view(id), grad, gpu.cuda_stream());
    }
    cpu.reduce_gradients();
    gpu.reduce_gradients();
    for (ParamId id = 0; id < cpu.num_params(); ++id) {
      CAPTURE(id);
      REQUIRE(bitwise_equal(read_view(gpu.grad_view(id), gpu.cuda_stream()), read_view(cpu.grad_view(id), nullptr)));
    }
    cpu.step();
    gpu.step();
    REQUIRE(bitwise_equal(all_params(gpu), all_params(cpu)));
  }
}

TEST_CASE("device views, the stream and zero_grad", "[gpu][zero]") {
  std::shared_ptr<Communicator> comm = nccl() ? nccl() : solo();
  const Device device = nccl() ? nccl()->device() : my_device();
  Model model(kSizes, device, 3);
  ZeroOptimizer opt(comm, OptimizerConfig{}, {model.group(0, kSizes.size(), Hyperparams{}, false)});
  REQUIRE(opt.cuda_stream() != nullptr);
  // The compute stream is the optimizer's own; NCCL's collectives run on the communicator's.
  if (nccl()) REQUIRE(opt.cuda_stream() != nccl_stream(*nccl()));
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef p = opt.param_view(id);
    REQUIRE(p.device == device);
    REQUIRE(opt.grad_view(id).device == device);
    // The bucket view starts from the initial values (copied device to device).
    REQUIRE(bitwise_equal(read_view(p, opt.cuda_stream()), model.initial(static_cast<std::size_t>(id))));
    write_view(opt.grad_view(id), std::vector<float>(static_cast<std::size_t>(p.numel), 3.f), opt.cuda_stream());
  }
  opt.zero_grad();
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const std::vector<float> g = read_view(opt.grad_view(id), opt.cuda_stream());
    REQUIRE(bitwise_equal(g, std::vector<float>(g.size(), 0.f)));
  }
  const MemoryReport report = opt.memory_report();
  REQUIRE(report.state_bytes == 2 * 4 * report.shard_numel);  // Adam's two moments, on the device
}

TEST_CASE("CUDA parameters over the MPI communicator: CUDA-aware MPI, or a clear refusal", "[gpu][zero][mpi]") {
  OptimizerConfig config;
  config.algorithm = Algorithm::adam;
  config.bucket_bytes = 256;
  std::string reason;
  if (host_world()->size() == 1 || mpi_support::mpi_cuda_aware(&reason)) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      config.partition = partition;
      REQUIRE(bitwise_equal(train(host_world(), config, my_device(), 4), train(solo(), config, Device::cpu(), 4)));
    }
    return;
  }
  Model model(kSizes, my_device(), 5);
  const auto [code, what] = error_of([&] {
    ZeroOptimizer(host_world(), config, {model.group(0, kSizes.size(), Hyperparams{}, false)});
  });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("CUDA-aware") && Catch::Contains(reason));
}

TEST_CASE("device registration errors name the parameter", "[gpu][zero][errors]") {
  std::vector<float> host(8, 1.f), host_grad(8, 0.f);
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"w", TensorRef{host.data(), 8, DType::f32, my_device()},
                                   TensorRef{host_grad.data(), 8, DType::f32, my_device()}});
  OptimizerConfig external;
  external.storage = Storage::external;
  // Host buffers declared as device buffers: refused before any kernel could fault on them.
  auto [code, what] = error_of([&] { ZeroOptimizer(solo(), external, {group}); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("parameter 'w': param.data is host memory") &&
                         Catch::Contains("declared on " + device_name(my_device())));

  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  ParamGroupSpec missing;
  missing.params.push_back(ParamSpec{"far", TensorRef{nullptr, 4, DType::f32, Device::cuda(count)}, TensorRef{}});
  std::tie(code, what) = error_of([&] { ZeroOptimizer(solo(), OptimizerConfig{}, {missing}); });
  REQUIRE(code == ErrorCode::cuda);
  REQUIRE_THAT(what, Catch::Contains("parameter 'far' is on cuda:" + std::to_string(count)) &&
                         Catch::Contains("does not exist"));

  if (nccl()) {
    ParamGroupSpec on_cpu;
    on_cpu.params.push_back(ParamSpec{"cpu_param", TensorRef{host.data(), 8}, TensorRef{}});
    std::tie(code, what) = error_of([&] { ZeroOptimizer(nccl(), OptimizerConfig{}, {on_cpu}); });
    REQUIRE(code == ErrorCode::unsupported);
    REQUIRE_THAT(what, Catch::Contains("parameter 'cpu_param' is on cpu, but the nccl communicator is on " +
                                       device_name(nccl()->device())));
  }
}

TEST_CASE("divide_cuda rounds as the host division", "[gpu][kernels]") {
  shardopt_test::TestStream stream;
  for (int64_t n : {0, 1, 3, 4, 5, 17, 1000, 4099}) {
    for (int offset = 0; offset < 4; ++offset) {
      CAPTURE(n, offset);
      std::vector<float> values = seeded_values(static_cast<uint32_t>(n * 7 + offset), n, 100.f);
      DeviceArray<float> x(static_cast<std::size_t>(n + offset));
      x.upload(values, static_cast<std::size_t>(offset));
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      kernels::divide_cuda(x.data() + offset, DType::f32, n, 3.f, stream.opaque());
      stream.sync();
      for (float& v : values) v = v / 3.f;
      REQUIRE(bitwise_equal(x.download(static_cast<std::size_t>(offset), static_cast<std::size_t>(n)), values));
    }
  }
}

int main(int argc, char** argv) {
  CommOptions options;
  options.timeout_seconds = 120;  // a failed assertion on one rank must not hang the others
  host_world() = mpi_world(options);
  Communicator& world = *host_world();

  std::string reason;
  const bool present = shardopt_test::cuda_device_present(&reason);
  float missing = present ? 0.f : 1.f;
  world.all_reduce(&missing, 1, DType::f32, ReduceOp::max);
  if (missing > 0) {
    // tests/gpu/test_cuda_registration_host.cpp checks the device-less errors on every rank.
    if (world.rank() == 0) {
      std::printf("SKIPPED: no CUDA device: %s\n", present ? "on another rank" : reason.c_str());
    }
    host_world().reset();
    return shardopt_test::kSkipExitCode;
  }

  // One device per rank on each node (NCCL's rule, and what the sharded comparison needs).
  const shardopt_test::NodePlacement placement = shardopt_test::node_placement(world);
  if (!placement.enough_devices) {
    host_world().reset();
    return shardopt_test::kSkipExitCode;
  }

  my_device() = Device::cuda(placement.local_rank % placement.devices);
  if (cudaSetDevice(my_device().index) != cudaSuccess) {
    std::printf("rank %d: cudaSetDevice(%d) failed\n", world.rank(), my_device().index);
  }
  if (nccl_compiled_in()) {
    nccl() = nccl_world(options);
    my_device() = nccl()->device();
  }
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  world.all_reduce(&worst, 1, DType::f32, ReduceOp::max);
  nccl().reset();
  host_world().reset();
  return worst > 0 ? 1 : 0;
}

TEST_CASE("the overlapped step (pipelined, update and NCCL on two streams) is bitwise the plain one", "[gpu][zero][streams]") {
  if (!nccl()) {
    SUCCEED("this build has no NCCL");
    return;
  }
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adamw}) {
    for (Storage storage : {Storage::bucket_view, Storage::external}) {
      CAPTURE(algorithm_name(algorithm), static_cast<int>(storage));
      OptimizerConfig plain;
      plain.algorithm = algorithm;
      plain.storage = storage;
      plain.bucket_bytes = 256;
      plain.pipeline_chunk_bytes = 0;  // update everything, then sync
      OptimizerConfig overlapped = plain;
      // Chunks of 64 elements: chunk k+1 is updated on the compute stream while chunk k is
      // broadcast on NCCL's, with no host wait in between (bucket view only; external storage
      // takes the plain path, which must still agree).
      overlapped.pipeline_chunk_bytes = 256;
      const std::vector<float> reference = train(solo(), plain, Device::cpu(), 6);
      const std::vector<float> unpipelined = train(nccl(), plain, nccl()->device(), 6);
      const std::vector<float> pipelined = train(nccl(), overlapped, nccl()->device(), 6);
      REQUIRE(bitwise_equal(unpipelined, reference));
      REQUIRE(bitwise_equal(pipelined, unpipelined));
    }
  }
}

// Muon on CUDA parameters (cuBLAS Newton-Schulz): within the products' reordering tolerance of
// the CPU path (tests/gpu/test_cuda_muon.cpp: the kernels), the AdamW group beside it bitwise;
// over NCCL each rank orthogonalises the matrices it owns, and every rank ends with one
// single-GPU run's bits.
TEST_CASE("a Muon + AdamW step on CUDA parameters follows the CPU step", "[gpu][zero][muon]") {
  const std::vector<int64_t> sizes = {24 * 16, 16 * 40, 33 * 33, 16, 7};
  const std::vector<std::vector<int64_t>> shapes = {{24, 16}, {16, 40}, {33, 33}};
  const auto train_muon = [&](std::shared_ptr<Communicator> comm, Device device) {
    Model model(sizes, device, 5);
    Hyperparams muon_hyper;
    muon_hyper.lr = 0.02;
    muon_hyper.weight_decay = 0.1;
    muon_hyper.momentum = 0.95;
    muon_hyper.nesterov = true;
    muon_hyper.eps = 1e-7;
    ParamGroupSpec matrices = model.group(0, 3, muon_hyper, false);
    matrices.settings.algorithm = Algorithm::muon;
    for (std::size_t i = 0; i < 3; ++i) matrices.params[i].shape = shapes[i];
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.bucket_bytes = 256;
    ZeroOptimizer opt(comm, config, {matrices, model.group(3, sizes.size(), hyper_for(Algorithm::adamw), false)});
    for (int s = 0; s < 4; ++s) {
      for (ParamId id = 0; id < opt.num_params(); ++id) {
        const TensorRef g = opt.grad_view(id);
        write_view(g, seeded_values(500u + static_cast<uint32_t>(s * 31 + id), g.numel, 0.1f), opt.cuda_stream());
      }
      opt.step();
    }
    return all_params(opt);
  };
  const std::vector<float> cpu = train_muon(solo(), Device::cpu());
  const std::vector<float> gpu = train_muon(solo(), my_device());
  REQUIRE(gpu.size() == cpu.size());
  const std::size_t matrix_elements = static_cast<std::size_t>(sizes[0] + sizes[1] + sizes[2]);
  // Four steps of at most lr x sqrt(max(1, rows/cols)) (<= 0.03) each: a few bf16 steps of that.
  double gap = 0.0;
  for (std::size_t i = 0; i < matrix_elements; ++i) gap = std::max(gap, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  CAPTURE(gap);
  CHECK(gap <= 3e-2 * 0.03 * 4);
  CHECK(std::memcmp(gpu.data() + matrix_elements, cpu.data() + matrix_elements,
                    (gpu.size() - matrix_elements) * sizeof(float)) == 0);  // AdamW: element-wise, bitwise
  if (nccl()) REQUIRE(bitwise_equal(train_muon(nccl(), nccl()->device()), gpu));
}

// 8-bit blockwise moments on CUDA parameters (kernels/cuda/compact_kernels.cu): the step is
// bitwise the CPU one (sizes above and below the 4096-element threshold, partial last blocks),
// on one GPU and sharded over NCCL (sorted_greedy keeps each parameter whole).
TEST_CASE("a q8 Adam/AdamW step on CUDA parameters is bitwise the CPU step", "[gpu][zero][q8]") {
  const std::vector<int64_t> sizes = {5000, 13, 4099, 70001};
  const auto train_q8 = [&](std::shared_ptr<Communicator> comm, OptimizerConfig config, Device device) {
    Model model(sizes, device, 7);
    Hyperparams h;
    h.lr = 0.01;
    h.weight_decay = 0.02;
    ZeroOptimizer opt(comm, config, {model.group(0, sizes.size(), h, false)});
    for (int s = 0; s < 6; ++s) {
      for (ParamId id = 0; id < opt.num_params(); ++id) {
        const TensorRef g = opt.grad_view(id);
        write_view(g, seeded_values(3000u + static_cast<uint32_t>(s * 97 + id), g.numel, 0.1f), opt.cuda_stream());
      }
      opt.step();
    }
    return all_params(opt);
  };
  for (Algorithm algorithm : {Algorithm::adam, Algorithm::adamw}) {
    CAPTURE(algorithm_name(algorithm));
    OptimizerConfig config;
    config.algorithm = algorithm;
    config.partition = PartitionStrategy::sorted_greedy;
    config.state_precision = StatePrecision::q8;
    const std::vector<float> cpu = train_q8(solo(), config, Device::cpu());
    REQUIRE(bitwise_equal(train_q8(solo(), config, my_device()), cpu));
    if (nccl()) REQUIRE(bitwise_equal(train_q8(nccl(), config, nccl()->device()), cpu));
  }
}

// Checkpoints and state dicts move 8-bit moments through host memory only: with q8 on CUDA
// parameters each entry point refuses by name, nothing read from or written to the device.
TEST_CASE("q8 moments of CUDA parameters: checkpoints and state dicts refuse by name", "[gpu][zero][q8][errors]") {
  const std::vector<int64_t> sizes = {5000};
  Model model(sizes, my_device(), 7);
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = PartitionStrategy::sorted_greedy;
  config.state_precision = StatePrecision::q8;
  ZeroOptimizer opt(solo(), config, {model.group(0, sizes.size(), Hyperparams{}, false)});
  opt.step();
  const std::string why = "checkpoints and state dicts carry 8-bit moments of CPU parameters only";
  const auto refused = [&](const std::function<void()>& call, const std::string& operation) {
    try {
      call();
      FAIL(operation << " was not refused");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::unsupported);
      CHECK_THAT(e.what(), Catch::Contains(operation) && Catch::Contains(why) && Catch::Contains("cuda:"));
    }
  };
  refused([&] { opt.save("q8_cuda_ckpt_never_written"); }, "save");
  refused([&] { opt.consolidate_state_dict(0); }, "consolidate_state_dict");
  refused([&] { opt.load_state_dict(StateDict{}); }, "load_state_dict");
}
