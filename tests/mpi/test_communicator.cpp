// tests/mpi/test_communicator.cpp — the MPI communicator's collectives at odd and zero sizes, raw bytes, capabilities and options.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "comm/mpi/mpi_cuda_support.hpp"
#include "comm/raw_collectives.hpp"
#include "mpi_test_support.hpp"

using shardopt::DType;
using shardopt::ReduceOp;
using shardopt_test::world;

TEST_CASE("broadcast, all_gather, reduce_scatter and all_reduce give the expected values", "[comm]") {
  auto& comm = *world();
  const int n = comm.size(), me = comm.rank();
  REQUIRE(std::string(comm.backend_name()) == "mpi");
  for (int64_t count : {0, 1, 3, 17, 1000}) {
    CAPTURE(count);
    // broadcast from the last rank
    std::vector<float> b(static_cast<std::size_t>(count), me == n - 1 ? 7.5f : 0.f);
    comm.broadcast(b.data(), count, DType::f32, n - 1);
    for (float x : b) REQUIRE(x == 7.5f);

    // in-place all_gather: rank r's block holds r + i
    std::vector<float> g(static_cast<std::size_t>(count * n), -1.f);
    for (int64_t i = 0; i < count; ++i) g[static_cast<std::size_t>(me * count + i)] = static_cast<float>(me * 1000 + i);
    comm.all_gather(g.data() + me * count, g.data(), count, DType::f32);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) REQUIRE(g[static_cast<std::size_t>(r * count + i)] == static_cast<float>(r * 1000 + i));

    // out-of-place all_gather of 16-bit words is bit-exact
    std::vector<uint16_t> mine(static_cast<std::size_t>(count), static_cast<uint16_t>(0xABC0 + me));
    std::vector<uint16_t> all(static_cast<std::size_t>(count * n));
    comm.all_gather(mine.data(), all.data(), count, DType::bf16);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) REQUIRE(all[static_cast<std::size_t>(r * count + i)] == 0xABC0 + r);

    // reduce_scatter(avg) of (rank+1) everywhere: each block averages to (n+1)/2
    std::vector<float> rs_in(static_cast<std::size_t>(count * n), static_cast<float>(me + 1));
    std::vector<float> rs_out(static_cast<std::size_t>(count), 0.f);
    comm.reduce_scatter(rs_in.data(), rs_out.data(), count, DType::f32, ReduceOp::avg);
    for (float x : rs_out) REQUIRE(x == static_cast<float>(n + 1) / 2.f);

    // all_reduce sum / max
    std::vector<float> s(static_cast<std::size_t>(count), static_cast<float>(me + 1));
    comm.all_reduce(s.data(), count, DType::f32, ReduceOp::sum);
    for (float x : s) REQUIRE(x == static_cast<float>(n * (n + 1) / 2));
    std::vector<float> mx(static_cast<std::size_t>(count), static_cast<float>(me));
    auto pending = comm.all_reduce_async(mx.data(), count, DType::f32, ReduceOp::max);
    pending->wait();
    for (float x : mx) REQUIRE(x == static_cast<float>(n - 1));
  }
  comm.barrier();
}

TEST_CASE("split makes independent subgroups", "[comm]") {
  auto& comm = *world();
  auto sub = comm.split(comm.rank() % 2, -comm.rank());  // reverse order inside each group
  REQUIRE(sub != nullptr);
  const int expected_size = (comm.size() + 1 - comm.rank() % 2) / 2;
  REQUIRE(sub->size() == expected_size);
  float v = static_cast<float>(comm.rank());
  sub->all_reduce(&v, 1, DType::f32, ReduceOp::sum);
  float expected = 0;
  for (int r = comm.rank() % 2; r < comm.size(); r += 2) expected += static_cast<float>(r);
  REQUIRE(v == expected);
  // Highest world rank gets key-order rank 0.
  float top = static_cast<float>(comm.rank());
  sub->broadcast(&top, 1, DType::f32, 0);
  float highest = static_cast<float>(comm.rank());
  for (int r = comm.rank() % 2; r < comm.size(); r += 2) highest = static_cast<float>(r);
  REQUIRE(top == highest);
  // A negative color opts out.
  auto none = comm.split(-1, 0);
  REQUIRE(none == nullptr);
}

TEST_CASE("bad collective arguments are refused", "[comm]") {
  auto& comm = *world();
  float x = 0;
  REQUIRE_THROWS_WITH(comm.broadcast(&x, 1, DType::f32, comm.size()), Catch::Contains("is not a rank of this"));
  REQUIRE_THROWS_WITH(comm.all_reduce(&x, 1, DType::f32, static_cast<ReduceOp>(5)),
                      Catch::Contains("does not support reduce op unknown (5) on dtype f32"));
  REQUIRE_THROWS_WITH(comm.all_reduce(&x, -1, DType::f32, ReduceOp::sum), Catch::Contains("negative count"));
}

TEST_CASE("a borrowed MPI communicator works and stays the caller's", "[comm]") {
  MPI_Comm mine = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, world()->size() - world()->rank(), &mine);  // reversed ranks
  {
    auto borrowed = shardopt::mpi_borrow(&mine);
    REQUIRE(borrowed->size() == world()->size());
    REQUIRE(borrowed->rank() == world()->size() - 1 - world()->rank());
    float v = static_cast<float>(borrowed->rank());
    borrowed->broadcast(&v, 1, DType::f32, 0);
    REQUIRE(v == 0.f);
  }
  // The borrowed communicator was duplicated, so the caller's one is still usable.
  int size = 0;
  REQUIRE(MPI_Comm_size(mine, &size) == MPI_SUCCESS);
  REQUIRE(size == world()->size());
  MPI_Comm_free(&mine);
  REQUIRE_THROWS_WITH(shardopt::mpi_borrow(nullptr), Catch::Contains("the MPI_Comm pointer is null"));
}

namespace {

// Byte i of rank r's record: differs between ranks, positions and record sizes, and covers
// all 256 values.
unsigned char record_byte(int rank, int64_t i, int64_t size) {
  return static_cast<unsigned char>(rank * 97 + i * 31 + size * 7 + 3);
}

}  // namespace

TEST_CASE("byte broadcast and all_gather move records of any size bit for bit", "[comm][byte]") {
  auto& comm = *world();
  const int n = comm.size(), me = comm.rank();
  for (int64_t size : {1, 3, 5, 7, 13, 1001}) {
    CAPTURE(size);
    for (int root = 0; root < n; ++root) {
      std::vector<unsigned char> b(static_cast<std::size_t>(size));
      for (int64_t i = 0; i < size; ++i) b[static_cast<std::size_t>(i)] = record_byte(me, i, size);
      if (root % 2 == 0) {
        comm.broadcast(b.data(), size, DType::byte, root);
      } else {
        comm.broadcast_async(b.data(), size, DType::byte, root)->wait();
      }
      for (int64_t i = 0; i < size; ++i) REQUIRE(b[static_cast<std::size_t>(i)] == record_byte(root, i, size));
    }
    std::vector<unsigned char> mine(static_cast<std::size_t>(size));
    for (int64_t i = 0; i < size; ++i) mine[static_cast<std::size_t>(i)] = record_byte(me, i, size);
    std::vector<unsigned char> expected(static_cast<std::size_t>(size * n));
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < size; ++i) expected[static_cast<std::size_t>(r * size + i)] = record_byte(r, i, size);
    // out of place, blocking
    std::vector<unsigned char> all(static_cast<std::size_t>(size * n), 0xEE);
    comm.all_gather(mine.data(), all.data(), size, DType::byte);
    REQUIRE(all == expected);
    // in place, nonblocking: this rank's block sits at an odd byte offset for odd sizes
    std::vector<unsigned char> in_place(static_cast<std::size_t>(size * n), 0xEE);
    std::copy(mine.begin(), mine.end(), in_place.begin() + me * size);
    comm.all_gather_async(in_place.data() + me * size, in_place.data(), size, DType::byte)->wait();
    REQUIRE(in_place == expected);
  }
}

namespace {

struct OddRecord {  // 5 bytes: the records that 16-bit words could not carry
  unsigned char bytes[5];
};

}  // namespace

TEST_CASE("all_gather_records and broadcast_record carry odd-sized records", "[comm][byte]") {
  auto& comm = *world();
  OddRecord mine{};
  for (int i = 0; i < 5; ++i) mine.bytes[i] = record_byte(comm.rank(), i, 5);
  const std::vector<OddRecord> all = shardopt::comm::all_gather_records(comm, mine);
  REQUIRE(all.size() == static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    for (int i = 0; i < 5; ++i) REQUIRE(all[static_cast<std::size_t>(r)].bytes[i] == record_byte(r, i, 5));
  OddRecord from_last = mine;
  shardopt::comm::broadcast_record(comm, from_last, comm.size() - 1);
  for (int i = 0; i < 5; ++i) REQUIRE(from_last.bytes[i] == record_byte(comm.size() - 1, i, 5));
}

TEST_CASE("reductions refuse byte, naming the collective and the dtype", "[comm][byte]") {
  auto& comm = *world();
  const int n = comm.size();
  std::vector<unsigned char> send(static_cast<std::size_t>(4 * n), 1), recv(4, 0);
  const auto refused = [](const char* op, auto&& call) {
    CAPTURE(op);
    const auto error = shardopt_test::error_of(call);
    REQUIRE(error.first == shardopt::ErrorCode::unsupported);
    REQUIRE_THAT(error.second, Catch::Contains(std::string(op) + " over MPI cannot reduce dtype byte"));
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    refused("all_reduce", [&] { comm.all_reduce(recv.data(), 4, DType::byte, op); });
    refused("all_reduce", [&] { comm.all_reduce_async(recv.data(), 4, DType::byte, op); });
    refused("reduce_scatter", [&] { comm.reduce_scatter(send.data(), recv.data(), 4, DType::byte, op); });
    refused("reduce_scatter", [&] { comm.reduce_scatter_async(send.data(), recv.data(), 4, DType::byte, op); });
    refused("reduce", [&] { comm.reduce(send.data(), recv.data(), 4, DType::byte, op, 0); });
    refused("reduce", [&] { comm.reduce_async(send.data(), recv.data(), 4, DType::byte, op, 0); });
  }
  // Refused before anything was issued: the communicator still works.
  comm.barrier();
}

TEST_CASE("the MPI communicator reports its capabilities", "[comm]") {
  auto& comm = *world();
  REQUIRE(comm.cuda_aware() == shardopt::mpi_support::mpi_cuda_aware(nullptr));
  REQUIRE(comm.cuda_stream() == nullptr);
  auto sub = comm.split(0, comm.rank());
  REQUIRE(sub->cuda_aware() == comm.cuda_aware());
}

TEST_CASE("a NaN or negative timeout is refused when the communicator is created", "[comm]") {
  shardopt::CommOptions options;
  options.timeout_seconds = std::numeric_limits<double>::quiet_NaN();
  auto error = shardopt_test::error_of([&] { shardopt::mpi_world(options); });
  REQUIRE(error.first == shardopt::ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("mpi_world: CommOptions.timeout_seconds is NaN"));
  MPI_Comm self = MPI_COMM_SELF;
  error = shardopt_test::error_of([&] { shardopt::mpi_borrow(&self, options); });
  REQUIRE(error.first == shardopt::ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("mpi_borrow: CommOptions.timeout_seconds is NaN"));
  // Negative is refused too (it used to mean "no watchdog", silently); 0 means "no watchdog".
  options.timeout_seconds = -1;
  error = shardopt_test::error_of([&] { shardopt::mpi_borrow(&self, options); });
  REQUIRE(error.first == shardopt::ErrorCode::invalid_argument);
  REQUIRE_THAT(error.second, Catch::Contains("mpi_borrow: CommOptions.timeout_seconds is -1, negative"));
  options.timeout_seconds = 0;
  auto unwatched = shardopt::mpi_borrow(&self, options);
  float x = 2.f;
  unwatched->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  REQUIRE(x == 2.f);
}
