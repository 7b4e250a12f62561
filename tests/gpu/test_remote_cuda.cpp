// tests/gpu/test_remote_cuda.cpp — the remote optimizer fed from CUDA device memory (owners' initial values, dense and sparse pushes, pulls into device memory) ends bitwise where the same run from host memory ends; skipped (77) without a device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using shardopt_test::DeviceArray;

namespace {

std::shared_ptr<Communicator>& world() {
  static std::shared_ptr<Communicator> comm;
  return comm;
}

constexpr int64_t kRows = 64, kRowSize = 8, kDense = 40;
constexpr int kSteps = 3;

std::vector<float> ramp(std::size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<float>((i * 37) % 101) / 101.f;
  return v;
}

// What one run ends with: the table and the dense parameter pulled, the rows pulled by pull_rows.
struct Result {
  std::vector<float> emb, w, rows;
};

// Rank 0 owns "emb" (SGD, rows) and "w" (Adam, dense); every rank trains, in deterministic order.
// `device`: every buffer the optimizer reads or writes lives in CUDA device memory.
Result run(bool device) {
  auto& comm = world();
  const int rank = comm->rank();
  const std::vector<float> emb0 = ramp(kRows * kRowSize, 1.f, -0.5f), w0 = ramp(kDense, 0.5f, 0.25f);
  DeviceArray<float> emb0_d(emb0.size()), w0_d(w0.size());
  emb0_d.upload(emb0);
  w0_d.upload(w0);
  std::vector<RemoteGroupSpec> groups;
  if (rank == 0) {
    RemoteGroupSpec sgd;
    sgd.algorithm = Algorithm::sgd;
    sgd.hyper.lr = 0.5;
    sgd.params.push_back({"emb", kRows, kRowSize, 0, -1, device ? emb0_d.data() : emb0.data()});
    RemoteGroupSpec adam;
    adam.algorithm = Algorithm::adam;
    adam.hyper.lr = 0.01;
    adam.params.push_back({"w", kDense, 1, 0, -1, device ? w0_d.data() : w0.data()});
    groups = {sgd, adam};
  }
  RemoteOptions options;
  options.order = RemoteOrder::deterministic;
  options.timeout_seconds = 20;
  RemoteOptimizer remote(comm, groups, options);
  const RemoteParam emb = remote.lookup("emb"), w = remote.lookup("w");
  for (int k = 0; k < kSteps; ++k) {
    const std::vector<int64_t> rows = {(rank * 7 + k) % kRows, (rank * 7 + k + 5) % kRows, (rank * 7 + k) % kRows};
    const std::vector<float> values = ramp(rows.size() * kRowSize, 0.125f, static_cast<float>(rank + k));
    const std::vector<float> grad = ramp(kDense, 0.25f, -0.1f * static_cast<float>(k + rank));
    DeviceArray<int64_t> rows_d(rows.size());
    DeviceArray<float> values_d(values.size()), grad_d(grad.size());
    rows_d.upload(rows);
    values_d.upload(values);
    grad_d.upload(grad);
    const RemoteContext context = remote.open_context();
    remote.push_rows(context, emb, device ? rows_d.data() : rows.data(), static_cast<int64_t>(rows.size()),
                     device ? values_d.data() : values.data());
    remote.push(context, w, device ? grad_d.data() : grad.data(), kDense);
    remote.step(context);  // the pushed buffers are free once it returns
  }
  comm->barrier();  // every trainer's steps applied
  Result result;
  const std::vector<int64_t> asked = {3, 0, kRows - 1, 3};
  DeviceArray<float> emb_d(kRows * kRowSize), w_d(kDense), rows_out_d(asked.size() * kRowSize);
  DeviceArray<int64_t> asked_d(asked.size());
  asked_d.upload(asked);
  if (device) {
    remote.pull(emb, emb_d.data(), kRows * kRowSize);
    remote.pull(w, w_d.data(), kDense);
    remote.pull_rows(emb, asked_d.data(), static_cast<int64_t>(asked.size()), rows_out_d.data());
    result.emb = emb_d.download(0, kRows * kRowSize);
    result.w = w_d.download(0, kDense);
    result.rows = rows_out_d.download(0, asked.size() * kRowSize);
  } else {
    result.emb.resize(kRows * kRowSize);
    result.w.resize(kDense);
    result.rows.resize(asked.size() * kRowSize);
    remote.pull(emb, result.emb.data(), kRows * kRowSize);
    remote.pull(w, result.w.data(), kDense);
    remote.pull_rows(emb, asked.data(), static_cast<int64_t>(asked.size()), result.rows.data());
  }
  remote.close();
  comm->barrier();
  return result;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("remote optimizer: buffers in CUDA device memory give the host run's bits", "[remote][cuda]") {
  const Result host = run(false);
  const Result device = run(true);
  CHECK(bitwise_equal(device.emb, host.emb));
  CHECK(bitwise_equal(device.w, host.w));
  CHECK(bitwise_equal(device.rows, host.rows));
  // pull_rows gave the rows asked for, in order (row 3 twice).
  CHECK(std::memcmp(host.rows.data(), host.emb.data() + 3 * kRowSize, kRowSize * sizeof(float)) == 0);
  CHECK(std::memcmp(host.rows.data() + 3 * kRowSize, host.emb.data() + 3 * kRowSize, kRowSize * sizeof(float)) == 0);
  const std::vector<float> emb0 = ramp(kRows * kRowSize, 1.f, -0.5f);
  CHECK_FALSE(bitwise_equal(host.emb, emb0));  // the steps did change it
}

int main(int argc, char** argv) {
  CommOptions options;
  options.timeout_seconds = 20;
  world() = remote_mpi_world(options);
  std::string reason;
  float absent = shardopt_test::cuda_device_present(&reason) ? 0.f : 1.f;
  world()->all_reduce(&absent, 1, DType::f32, ReduceOp::max);  // every rank skips, or none
  if (absent > 0.f) {
    if (world()->rank() == 0) std::printf("SKIPPED: no CUDA device: %s\n", reason.c_str());
    world().reset();
    return shardopt_test::kSkipExitCode;
  }
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  world()->all_reduce(&worst, 1, DType::f32, ReduceOp::max);
  world().reset();
  return worst > 0 ? 1 : 0;
}
