// tests/gpu/test_nccl_communicator.cpp — the NCCL communicator under mpiexec: collectives (raw bytes too), capabilities, splits, errors and the watchdog.
//
// Runs as its own Catch2 runner. Without a CUDA device on every rank (or with fewer devices
// than ranks on a node) it first checks that nccl_world fails cleanly on every rank, then
// reports SKIPPED with exit code 77.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "shardopt/nccl.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::Error;
using shardopt::ErrorCode;
using shardopt::ReduceOp;
using shardopt_test::DeviceArray;

std::shared_ptr<Communicator>& host_world() {
  static std::shared_ptr<Communicator> comm;
  return comm;
}
std::shared_ptr<Communicator>& nccl() {
  static std::shared_ptr<Communicator> comm;
  return comm;
}

// Values every rank can predict: small integers, so sums are exact in f32 and bf16.
float value_of(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + i % 17); }

uint16_t to_bf16(float f) {  // exact for the small integers used here
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f = 0.f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename Call>
Error error_of(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected shardopt::Error");
  return Error(ErrorCode::internal, "unreachable");
}

const int64_t kCounts[] = {0, 1, 7, 4099, (1 << 20) + 3};

}  // namespace

TEST_CASE("nccl communicator basics", "[nccl]") {
  Communicator& c = *nccl();
  REQUIRE(shardopt::nccl_compiled_in());
  REQUIRE(c.rank() == host_world()->rank());
  REQUIRE(c.size() == host_world()->size());
  REQUIRE(c.device().is_cuda());
  REQUIRE(std::string(c.backend_name()) == "nccl");
  REQUIRE(shardopt::nccl_stream(c) != nullptr);
  // Capabilities, not names: device buffers, and the stream collectives are ordered on.
  REQUIRE(c.cuda_aware());
  REQUIRE(c.cuda_stream() == shardopt::nccl_stream(c));
  const Error e = error_of([] { shardopt::nccl_stream(*host_world()); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  // Refused on every rank before any collective, so no rank waits for the others.
  shardopt::CommOptions nan_timeout;
  nan_timeout.timeout_seconds = std::numeric_limits<double>::quiet_NaN();
  const Error nan = error_of([&] { shardopt::nccl_world(nan_timeout); });
  REQUIRE(nan.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(nan.what(), Catch::Contains("nccl_world: CommOptions.timeout_seconds is NaN"));
}

TEST_CASE("nccl byte broadcast and all_gather move odd-sized records bit for bit", "[nccl][byte]") {
  Communicator& c = *nccl();
  const int n = c.size();
  const auto byte_of = [](int rank, int64_t i, int64_t size) {
    return static_cast<uint8_t>(rank * 97 + i * 31 + size * 7 + 3);
  };
  for (int64_t size : {1, 3, 5, 13, 4099}) {
    CAPTURE(size);
    const std::size_t bytes = static_cast<std::size_t>(size);
    std::vector<uint8_t> mine(bytes);
    for (std::size_t i = 0; i < bytes; ++i) mine[i] = byte_of(c.rank(), static_cast<int64_t>(i), size);
    for (int root = 0; root < n; ++root) {
      DeviceArray<uint8_t> buffer(bytes);
      buffer.upload(mine);
      c.broadcast(buffer.data(), size, DType::byte, root);
      const std::vector<uint8_t> got = buffer.download(0, bytes);
      for (std::size_t i = 0; i < bytes; ++i) REQUIRE(got[i] == byte_of(root, static_cast<int64_t>(i), size));
    }
    std::vector<uint8_t> expected(bytes * static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < bytes; ++i) expected[static_cast<std::size_t>(r) * bytes + i] = byte_of(r, static_cast<int64_t>(i), size);
    DeviceArray<uint8_t> send(bytes), all(bytes * static_cast<std::size_t>(n));
    send.upload(mine);
    c.all_gather_async(send.data(), all.data(), size, DType::byte)->wait();
    REQUIRE(all.download(0, all.size()) == expected);
  }
}

TEST_CASE("nccl reductions refuse byte, naming the collective and the dtype", "[nccl][byte]") {
  Communicator& c = *nccl();
  DeviceArray<uint8_t> send(static_cast<std::size_t>(4 * c.size())), recv(4);
  const auto refused = [](const char* op, const Error& e) {
    CAPTURE(op);
    REQUIRE(e.code() == ErrorCode::unsupported);
    REQUIRE_THAT(e.what(), Catch::Contains(std::string(op) + " over nccl cannot reduce dtype byte"));
  };
  refused("all_reduce", error_of([&] { c.all_reduce(recv.data(), 4, DType::byte, ReduceOp::sum); }));
  refused("all_reduce", error_of([&] { c.all_reduce_async(recv.data(), 4, DType::byte, ReduceOp::max); }));
  refused("reduce_scatter", error_of([&] { c.reduce_scatter(send.data(), recv.data(), 4, DType::byte, ReduceOp::avg); }));
  refused("reduce", error_of([&] { c.reduce_async(send.data(), recv.data(), 4, DType::byte, ReduceOp::sum, 0); }));
  c.barrier();  // refused before anything was enqueued: still usable
}

TEST_CASE("nccl broadcast from every root", "[nccl]") {
  Communicator& c = *nccl();
  for (int64_t count : kCounts) {
    for (int root = 0; root < c.size(); ++root) {
      CAPTURE(count, root);
      const std::size_t n = static_cast<std::size_t>(count);
      DeviceArray<float> buffer(n);
      std::vector<float> mine(n), expected(n);
      for (std::size_t i = 0; i < n; ++i) {
        mine[i] = value_of(c.rank(), static_cast<int64_t>(i));
        expected[i] = value_of(root, static_cast<int64_t>(i));
      }
      buffer.upload(mine);
      c.broadcast(buffer.data(), count, DType::f32, root);
      REQUIRE(buffer.download(0, n) == expected);
    }
  }
  // 16-bit types travel as they are.
  DeviceArray<uint16_t> halves(5);
  std::vector<uint16_t> bits = {0x3c00, 0x7bff, 0x0001, 0x8000, static_cast<uint16_t>(c.rank())};
  halves.upload(bits);
  c.broadcast(halves.data(), 5, DType::f16, 0);
  bits[4] = 0;
  REQUIRE(halves.download(0, 5) == bits);
}

TEST_CASE("nccl all_gather, out of place and in place", "[nccl]") {
  Communicator& c = *nccl();
  const int size = c.size();
  for (int64_t count : kCounts) {
    CAPTURE(count);
    const std::size_t n = static_cast<std::size_t>(count);
    std::vector<float> expected(n * static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        expected[static_cast<std::size_t>(r) * n + i] = value_of(r, static_cast<int64_t>(i));
      }
    }
    std::vector<float> mine(expected.begin() + static_cast<std::ptrdiff_t>(c.rank() * n),
                            expected.begin() + static_cast<std::ptrdiff_t>((c.rank() + 1) * n));
    DeviceArray<float> send(n), recv(n * static_cast<std::size_t>(size));
    send.upload(mine);
    c.all_gather(send.data(), recv.data(), count, DType::f32);
    REQUIRE(recv.download(0, recv.size()) == expected);

    DeviceArray<float> in_place(n * static_cast<std::size_t>(size));
    in_place.upload(mine, static_cast<std::size_t>(c.rank()) * n);
    c.all_gather(in_place.data() + static_cast<std::size_t>(c.rank()) * n, in_place.data(), count,
                 DType::f32);
    REQUIRE(in_place.download(0, in_place.size()) == expected);
  }
}

TEST_CASE("nccl all_reduce and reduce_scatter: sum, avg, max; f32 and bf16", "[nccl]") {
  Communicator& c = *nccl();
  const int size = c.size();
  for (int64_t count : kCounts) {
    CAPTURE(count);
    const std::size_t n = static_cast<std::size_t>(count);
    std::vector<float> mine(n), sum(n), max(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = value_of(c.rank(), static_cast<int64_t>(i));
      for (int r = 0; r < size; ++r) sum[i] += value_of(r, static_cast<int64_t>(i));
      max[i] = value_of(size - 1, static_cast<int64_t>(i));
    }
    DeviceArray<float> buffer(n);
    buffer.upload(mine);
    c.all_reduce(buffer.data(), count, DType::f32, ReduceOp::sum);
    REQUIRE(buffer.download(0, n) == sum);

    buffer.upload(mine);
    c.all_reduce(buffer.data(), count, DType::f32, ReduceOp::max);
    REQUIRE(buffer.download(0, n) == max);

    buffer.upload(mine);
    c.all_reduce(buffer.data(), count, DType::f32, ReduceOp::avg);
    const std::vector<float> avg = buffer.download(0, n);
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(avg[i] == Approx(sum[i] / static_cast<float>(size)).epsilon(1e-6));
    }

    std::vector<uint16_t> mine16(n), sum16(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine16[i] = to_bf16(mine[i]);
      sum16[i] = to_bf16(sum[i]);
    }
    DeviceArray<uint16_t> buffer16(n);
    buffer16.upload(mine16);
    c.all_reduce(buffer16.data(), count, DType::bf16, ReduceOp::sum);
    const std::vector<uint16_t> got16 = buffer16.download(0, n);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(from_bf16(got16[i]) == from_bf16(sum16[i]));

    // reduce_scatter: rank r receives block r of the reduction of size*count elements.
    const std::size_t total = n * static_cast<std::size_t>(size);
    std::vector<float> send_values(total), block_sum(n);
    for (std::size_t i = 0; i < total; ++i) send_values[i] = value_of(c.rank(), static_cast<int64_t>(i));
    for (std::size_t i = 0; i < n; ++i) {
      const int64_t global = static_cast<int64_t>(static_cast<std::size_t>(c.rank()) * n + i);
      for (int r = 0; r < size; ++r) block_sum[i] += value_of(r, global);
    }
    DeviceArray<float> send(total), recv(n);
    send.upload(send_values);
    c.reduce_scatter(send.data(), recv.data(), count, DType::f32, ReduceOp::sum);
    REQUIRE(recv.download(0, n) == block_sum);
  }
}

TEST_CASE("nccl reduce to every root, in place and out of place: sum, avg, max; f32 and bf16", "[nccl]") {
  Communicator& c = *nccl();
  const int size = c.size();
  for (int64_t count : kCounts) {
    const std::size_t n = static_cast<std::size_t>(count);
    std::vector<float> mine(n), sum(n), max(n);
    std::vector<uint16_t> mine16(n), sum16(n);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = value_of(c.rank(), static_cast<int64_t>(i));
      for (int r = 0; r < size; ++r) sum[i] += value_of(r, static_cast<int64_t>(i));
      max[i] = value_of(size - 1, static_cast<int64_t>(i));
      mine16[i] = to_bf16(mine[i]);
      sum16[i] = to_bf16(sum[i]);
    }
    const std::vector<float> sentinel(n, -1.f);
    for (int root = 0; root < size; ++root) {
      CAPTURE(count, root);
      const bool is_root = c.rank() == root;
      // Out of place: only the root's recv changes, and send never does.
      DeviceArray<float> send(n), recv(n);
      send.upload(mine);
      recv.upload(sentinel);
      c.reduce(send.data(), recv.data(), count, DType::f32, ReduceOp::sum, root);
      REQUIRE(recv.download(0, n) == (is_root ? sum : sentinel));
      REQUIRE(send.download(0, n) == mine);

      // In place on the root.
      DeviceArray<float> buffer(n);
      buffer.upload(mine);
      c.reduce(buffer.data(), buffer.data(), count, DType::f32, ReduceOp::max, root);
      REQUIRE(buffer.download(0, n) == (is_root ? max : mine));

      // avg, nonblocking.
      recv.upload(sentinel);
      auto pending = c.reduce_async(send.data(), recv.data(), count, DType::f32, ReduceOp::avg, root);
      pending->wait();
      if (is_root) {
        const std::vector<float> avg = recv.download(0, n);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(avg[i] == Approx(sum[i] / static_cast<float>(size)).epsilon(1e-6));
        }
      }

      // bf16 sum in place (exact: small integers).
      DeviceArray<uint16_t> buffer16(n);
      buffer16.upload(mine16);
      c.reduce(buffer16.data(), buffer16.data(), count, DType::bf16, ReduceOp::sum, root);
      REQUIRE(buffer16.download(0, n) == (is_root ? sum16 : mine16));
    }
  }
}

TEST_CASE("nccl reduce_scatter_async, and several reduce_async in flight waited in any order", "[nccl]") {
  Communicator& c = *nccl();
  const int size = c.size();
  const int64_t count = 4099;
  const std::size_t n = static_cast<std::size_t>(count);
  const std::size_t total = n * static_cast<std::size_t>(size);
  std::vector<float> send_values(total), block_sum(n), block_max(n);
  for (std::size_t i = 0; i < total; ++i) send_values[i] = value_of(c.rank(), static_cast<int64_t>(i));
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t global = static_cast<int64_t>(static_cast<std::size_t>(c.rank()) * n + i);
    for (int r = 0; r < size; ++r) block_sum[i] += value_of(r, global);
    block_max[i] = value_of(size - 1, global);
  }
  DeviceArray<float> send(total), recv_sum(n), recv_max(n);
  send.upload(send_values);
  auto sum_pending = c.reduce_scatter_async(send.data(), recv_sum.data(), count, DType::f32, ReduceOp::sum);
  auto max_pending = c.reduce_scatter_async(send.data(), recv_max.data(), count, DType::f32, ReduceOp::max);
  max_pending->wait();
  sum_pending->wait();
  REQUIRE(recv_sum.download(0, n) == block_sum);
  REQUIRE(recv_max.download(0, n) == block_max);

  // One reduce per root, all in flight, waited in reverse.
  std::vector<float> mine(n), sum(n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = value_of(c.rank(), static_cast<int64_t>(i));
    for (int r = 0; r < size; ++r) sum[i] += value_of(r, static_cast<int64_t>(i));
  }
  DeviceArray<float> input(n);
  input.upload(mine);
  std::vector<std::unique_ptr<DeviceArray<float>>> outputs;
  std::vector<std::unique_ptr<shardopt::PendingCollective>> pending;
  for (int root = 0; root < size; ++root) {
    outputs.push_back(std::make_unique<DeviceArray<float>>(n));
    pending.push_back(c.reduce_async(input.data(), outputs.back()->data(), count, DType::f32, ReduceOp::sum, root));
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) (*it)->wait();
  REQUIRE(outputs[static_cast<std::size_t>(c.rank())]->download(0, n) == sum);
}

TEST_CASE("nccl async collectives complete on wait, in any order", "[nccl]") {
  Communicator& c = *nccl();
  const int64_t count = 1 << 16;
  const std::size_t n = static_cast<std::size_t>(count);
  DeviceArray<float> a(n), b(n);
  a.upload(std::vector<float>(n, 1.f));
  b.upload(std::vector<float>(n, static_cast<float>(c.rank())));
  auto first = c.all_reduce_async(a.data(), count, DType::f32, ReduceOp::sum);
  auto second = c.broadcast_async(b.data(), count, DType::f32, c.size() - 1);
  second->wait();
  first->wait();
  first->wait();  // waiting twice is harmless
  REQUIRE(a.download(0, n) == std::vector<float>(n, static_cast<float>(c.size())));
  REQUIRE(b.download(0, n) == std::vector<float>(n, static_cast<float>(c.size() - 1)));
  auto gathered = c.all_gather_async(a.data(), a.data(), 0, DType::f32);  // empty: done at once
  gathered->wait();
  c.barrier();
}

TEST_CASE("nccl split into subgroups", "[nccl]") {
  Communicator& c = *nccl();
  const int color = c.rank() % 2;
  auto group = c.split(color, -c.rank());  // keys reverse the order inside each group
  REQUIRE(group != nullptr);
  int expected_size = 0;
  int expected_rank = 0;
  for (int r = 0; r < c.size(); ++r) {
    if (r % 2 != color) continue;
    ++expected_size;
    if (r > c.rank()) ++expected_rank;
  }
  REQUIRE(group->size() == expected_size);
  REQUIRE(group->rank() == expected_rank);
  DeviceArray<float> one(1);
  one.upload({static_cast<float>(c.rank())});
  group->all_reduce(one.data(), 1, DType::f32, ReduceOp::sum);
  float expected = 0.f;
  for (int r = color; r < c.size(); r += 2) expected += static_cast<float>(r);
  REQUIRE(one.download(0, 1)[0] == expected);
  group->barrier();

  auto none = c.split(c.rank() == 0 ? -1 : 1, 0);
  REQUIRE((none == nullptr) == (c.rank() == 0));
  if (none) REQUIRE(none->size() == c.size() - 1);
}

TEST_CASE("nccl rejects bad arguments with clear errors", "[nccl]") {
  Communicator& c = *nccl();
  std::vector<float> host(8, 0.f);
  Error e = error_of([&] { c.all_reduce(host.data(), 8, DType::f32, ReduceOp::sum); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("host memory"));
  DeviceArray<float> buffer(8);
  e = error_of([&] { c.broadcast(buffer.data(), 8, DType::f32, c.size()); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { c.all_reduce(buffer.data(), -1, DType::f32, ReduceOp::sum); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  e = error_of([&] { c.reduce(buffer.data(), buffer.data(), 8, DType::f32, ReduceOp::sum, -1); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("reduce: root -1 is not a rank"));
  e = error_of([&] { c.reduce(host.data(), buffer.data(), 8, DType::f32, ReduceOp::sum, 0); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("host memory"));
  e = error_of([&] { c.reduce_scatter_async(buffer.data(), host.data(), 8, DType::f32, ReduceOp::sum); });
  REQUIRE(e.code() == ErrorCode::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("host memory"));
  // The communicator is still usable after rejected calls.
  c.barrier();
}

TEST_CASE("nccl watchdog: a collective only one rank issues times out instead of hanging", "[nccl][timeout]") {
  if (host_world()->size() < 2) {
    SUCCEED("needs at least 2 ranks");
    return;
  }
  shardopt::CommOptions options;
  options.timeout_seconds = 3;
  auto lonely = shardopt::nccl_world(options);
  DeviceArray<float> buffer(1024);
  if (lonely->rank() == 0) {
    const Error e = error_of([&] { lonely->all_reduce(buffer.data(), 1024, DType::f32, ReduceOp::sum); });
    REQUIRE(e.code() == ErrorCode::timeout);
    REQUIRE_THAT(e.what(), Catch::Contains("all_reduce"));
    REQUIRE_THAT(e.what(), Catch::Contains("rank 0"));
    // Poisoned: the next call fails at once with the same code, naming the all_reduce.
    const auto start = std::chrono::steady_clock::now();
    const Error again = error_of([&] { lonely->barrier(); });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(again.code() == ErrorCode::timeout);
    REQUIRE_THAT(again.what(), Catch::Contains("barrier on rank 0"));
    REQUIRE_THAT(again.what(), Catch::Contains("aborted"));
    REQUIRE_THAT(again.what(), Catch::Contains("all_reduce on rank 0"));
    REQUIRE(took < 1.0);
  }
  host_world()->barrier();
  lonely.reset();  // the other ranks' destructors give up after the timeout too
  host_world()->barrier();
}

int main(int argc, char** argv) {
  shardopt::CommOptions options;
  options.timeout_seconds = 120;  // a failed assertion on one rank must not hang the others
  host_world() = shardopt::mpi_world(options);
  Communicator& world = *host_world();

  std::string reason;
  const bool present = shardopt_test::cuda_device_present(&reason);
  float missing = present ? 0.f : 1.f;
  world.all_reduce(&missing, 1, DType::f32, ReduceOp::max);
  if (missing > 0) {
    // Every rank must get a clear Error, and none may hang waiting for the others.
    int failures = 0;
    try {
      shardopt::nccl_world(options);
      std::printf("rank %d: nccl_world succeeded without a CUDA device\n", world.rank());
      failures = 1;
    } catch (const Error& e) {
      const bool clear = (e.code() == ErrorCode::cuda || e.code() == ErrorCode::comm) &&
                         std::string(e.what()).find("rank " + std::to_string(world.rank())) !=
                             std::string::npos;
      if (!clear) {
        std::printf("rank %d: unexpected error from nccl_world: %s\n", world.rank(), e.what());
        failures = 1;
      }
    }
    float worst = static_cast<float>(failures);
    world.all_reduce(&worst, 1, DType::f32, ReduceOp::max);
    if (world.rank() == 0 && worst == 0) {
      std::printf("SKIPPED: no CUDA device: %s (checked that nccl_world fails cleanly on all %d "
                  "ranks)\n",
                  present ? "on another rank" : reason.c_str(), world.size());
    }
    host_world().reset();
    return worst > 0 ? 1 : shardopt_test::kSkipExitCode;
  }

  // NCCL needs a device per rank.
  if (!shardopt_test::node_placement(world).enough_devices) {
    host_world().reset();
    return shardopt_test::kSkipExitCode;
  }

  nccl() = shardopt::nccl_world(options);
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  world.all_reduce(&worst, 1, DType::f32, ReduceOp::max);
  nccl().reset();
  host_world().reset();
  return worst > 0 ? 1 : 0;
}
