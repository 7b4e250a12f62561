// tests/mpi/test_communicator.cpp — the MPI communicator's collectives at odd and zero sizes.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <numeric>
#include <vector>

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
