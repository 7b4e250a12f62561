// tests/gpu/test_checkpoint_cuda.cpp — checkpoints of CUDA optimizers under mpiexec: saved from the device, loaded on the CPU and back on the device, consolidated, at worlds 1 and 2, bitwise.
//
// Runs as its own Catch2 runner. Skips (exit 77) without a usable device on every rank, or with
// more ranks on a node than devices. The staging path these tests drive on a device is the one
// tests/checkpoint/test_staged_checkpoint.cpp drives on the CPU through the host copy engine;
// here the copies are the CUDA engine's (pinned slots, cudaMemcpyAsync, events).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "optim/zero_optimizer_impl.hpp"
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

// A directory fresh for each use: shared by the ranks of this run, or (own) this rank's alone,
// for optimizers over one-rank communicators.
std::string scratch(const std::string& name, bool own) {
  namespace fs = std::filesystem;
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(host_world()->size()) + "/" +
                          name + (own ? "_rank" + std::to_string(host_world()->rank()) : "");
  if (own || host_world()->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  host_world()->barrier();
  return dir;
}

std::vector<float> seeded_values(uint32_t seed, int64_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(gen);
  return values;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void write_view(const TensorRef& view, const std::vector<float>& values, void* stream) {
  REQUIRE(static_cast<int64_t>(values.size()) == view.numel);
  if (view.numel == 0) return;
  if (view.device.is_cpu()) {
    std::memcpy(view.data, values.data(), view.nbytes());
    return;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  REQUIRE(cudaMemcpyAsync(view.data, values.data(), view.nbytes(), cudaMemcpyHostToDevice, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
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

std::vector<int64_t> all_steps(const ZeroOptimizer& opt) {
  std::vector<int64_t> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) out.push_back(opt.param_step(id));
  return out;
}

// Odd sizes, an empty param, and one larger than a small staging slot.
const std::vector<int64_t> kSizes = {13, 1, 0, 64, 7, 100, 3, 31, 4099};

// Initial values on the CPU or a device, and a two-group bucket-view optimizer over them.
class Model {
 public:
  Model(Device device, uint32_t seed) : device_kind_(device) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      host_.push_back(seeded_values(seed + static_cast<uint32_t>(i), kSizes[i]));
      if (device.is_cuda()) {
        device_.push_back(std::make_unique<DeviceArray<float>>(host_.back().size()));
        device_.back()->upload(host_.back());
      }
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  std::unique_ptr<ZeroOptimizer> optimizer(std::shared_ptr<Communicator> comm, Algorithm algorithm) {
    OptimizerConfig config;
    config.algorithm = algorithm;
    config.partition = PartitionStrategy::sorted_greedy;
    config.bucket_bytes = 256;
    std::vector<ParamGroupSpec> groups(2);
    groups[0].hyper.lr = 0.01;
    groups[0].hyper.weight_decay = 0.02;
    if (algorithm == Algorithm::sgd) groups[0].hyper.momentum = 0.9;
    groups[1].hyper = groups[0].hyper;
    groups[1].hyper.lr = 0.005;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      ParamSpec p;
      p.name = "p" + std::to_string(i);
      float* data = device_kind_.is_cuda() ? device_[i]->data() : host_[i].data();
      p.param = TensorRef{data, kSizes[i], DType::f32, device_kind_};
      groups[i < 5 ? 0 : 1].params.push_back(p);
    }
    auto opt = std::make_unique<ZeroOptimizer>(comm, config, groups);
    opt->set_trainable(opt->find_param("p7"), false);  // a frozen param goes to file 0
    return opt;
  }

 private:
  Device device_kind_ = Device::cpu();
  std::vector<std::vector<float>> host_;
  std::vector<std::unique_ptr<DeviceArray<float>>> device_;
};

void train(ZeroOptimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      const TensorRef g = opt.grad_view(id);
      write_view(g, seeded_values(1000u + static_cast<uint32_t>(s * 97 + id), g.numel), opt.cuda_stream());
    }
    opt.step();
  }
}

// Small slots on the device too: chunks split tensors, and both slots are in flight.
void small_slots(ZeroOptimizer& opt, std::size_t bytes) { optimizer_internals(opt).staging.slot_bytes = bytes; }

// The round trip at one world: CUDA saves, the CPU loads and saves again, CUDA loads that.
void round_trip(std::shared_ptr<Communicator> device_comm, std::shared_ptr<Communicator> host_comm, Device device,
                const std::string& name) {
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adamw}) {
    for (std::size_t slot : {std::size_t{0}, std::size_t{4100}}) {
      CAPTURE(name, algorithm_name(algorithm), slot);
      const bool own = device_comm->size() == 1;
      const std::string from_gpu = scratch(name + "_from_gpu", own), from_cpu = scratch(name + "_from_cpu", own);
      Model reference_model(Device::cpu(), 11);
      auto reference = reference_model.optimizer(host_comm, algorithm);
      train(*reference, 0, 6);

      Model gpu_model(device, 11);
      auto gpu = gpu_model.optimizer(device_comm, algorithm);
      if (slot != 0) small_slots(*gpu, slot);
      train(*gpu, 0, 3);
      gpu->save(from_gpu);

      Model cpu_model(Device::cpu(), 99);
      auto cpu = cpu_model.optimizer(host_comm, algorithm);
      cpu->load(from_gpu);
      REQUIRE(bitwise_equal(all_params(*cpu), all_params(*gpu)));
      REQUIRE(all_steps(*cpu) == all_steps(*gpu));
      cpu->save(from_cpu);

      Model back_model(device, 98);
      auto back = back_model.optimizer(device_comm, algorithm);
      if (slot != 0) small_slots(*back, slot);
      back->load(from_cpu);
      REQUIRE(bitwise_equal(all_params(*back), all_params(*gpu)));
      train(*back, 3, 6);
      train(*cpu, 3, 6);
      REQUIRE(bitwise_equal(all_params(*cpu), all_params(*reference)));
      REQUIRE(bitwise_equal(all_params(*back), all_params(*reference)));
    }
  }
}

}  // namespace

TEST_CASE("a CUDA optimizer's checkpoint loads on the CPU and back on CUDA, bitwise (world 1)", "[gpu][checkpoint]") {
  round_trip(solo(), solo(), my_device(), "world1");
}

TEST_CASE("a sharded CUDA optimizer's checkpoint over NCCL loads on the CPU and back, bitwise (world N)",
          "[gpu][checkpoint]") {
  if (!nccl()) {
    SUCCEED("this build has no NCCL");
    return;
  }
  round_trip(nccl(), host_world(), nccl()->device(), "worldN");
}

TEST_CASE("consolidate_state_dict of a CUDA optimizer equals the CPU's; load_state_dict on CUDA resumes bitwise",
          "[gpu][checkpoint][state_dict]") {
  std::shared_ptr<Communicator> comm = nccl() ? nccl() : solo();
  const Device device = nccl() ? nccl()->device() : my_device();
  const int to = comm->size() - 1;
  for (std::size_t slot : {std::size_t{0}, std::size_t{4100}}) {
    CAPTURE(slot);
    Model cpu_model(Device::cpu(), 21);
    auto cpu = cpu_model.optimizer(solo(), Algorithm::adam);
    train(*cpu, 0, 3);
    cpu->consolidate_state_dict(0);
    const StateDict expected = cpu->state_dict();
    REQUIRE(expected.state.size() == kSizes.size() - 1);

    Model gpu_model(device, 21);
    auto gpu = gpu_model.optimizer(comm, Algorithm::adam);
    if (slot != 0) small_slots(*gpu, slot);
    train(*gpu, 0, 3);
    gpu->consolidate_state_dict(to);
    if (comm->rank() == to) {
      const StateDict got = gpu->state_dict();
      REQUIRE(got.state.size() == expected.state.size());
      for (const auto& [id, s] : expected.state) {
        CAPTURE(id);
        REQUIRE(got.state.at(id).step == s.step);
        for (const auto& [kind, values] : s.tensors) REQUIRE(bitwise_equal(got.state.at(id).tensors.at(kind), values));
      }
    }

    Model resumed_model(device, 21);
    auto resumed = resumed_model.optimizer(comm, Algorithm::adam);
    if (slot != 0) small_slots(*resumed, slot);
    // The parameters as they were at step 3, then the state: training continues as the CPU's.
    for (ParamId id = 0; id < resumed->num_params(); ++id) {
      write_view(resumed->param_view(id), read_view(cpu->param_view(id), nullptr), resumed->cuda_stream());
    }
    resumed->load_state_dict(expected);
    train(*cpu, 3, 5);
    train(*resumed, 3, 5);
    REQUIRE(bitwise_equal(all_params(*resumed), all_params(*cpu)));
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
    if (world.rank() == 0) {
      std::printf("SKIPPED: no CUDA device: %s\n", present ? "on another rank" : reason.c_str());
    }
    host_world().reset();
    return shardopt_test::kSkipExitCode;
  }
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
