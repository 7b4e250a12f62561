// tests/capi/test_capi_collectives.cpp — all_reduce, broadcast and all_gather on a C communicator handle: exact results on small integers, a non-zero root, and bad or differing arguments failing with the same named status on every rank.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "capi_test_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// bf16 of a (finite) float, rounded to nearest even.
uint16_t bf16_of(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Rank r's element i: a small integer, so every sum and average below is exact.
float value_of(int rank, int i) { return static_cast<float>((rank + 1) * (i % 7) - 3 * rank + i); }

}  // namespace

TEST_CASE("C all_reduce: sum, avg and max are exact on small integers", "[capi][collectives]") {
  CommHandle comm;
  const int size = comm.size(), rank = comm.rank();
  constexpr int kCount = 37;
  const auto op = GENERATE(SHARDOPT_REDUCE_SUM, SHARDOPT_REDUCE_AVG, SHARDOPT_REDUCE_MAX);
  CAPTURE(op);
  std::vector<float> expected(kCount);
  for (int i = 0; i < kCount; ++i) {
    float sum = 0.0f, max = value_of(0, i);
    for (int r = 0; r < size; ++r) {
      sum += value_of(r, i);
      max = std::max(max, value_of(r, i));
    }
    expected[i] = op == SHARDOPT_REDUCE_SUM ? sum : op == SHARDOPT_REDUCE_MAX ? max : sum / static_cast<float>(size);
  }
  std::vector<float> f32(kCount);
  for (int i = 0; i < kCount; ++i) f32[i] = value_of(rank, i);
  REQUIRE(shardopt_comm_all_reduce(comm.get(), f32.data(), kCount, SHARDOPT_DTYPE_F32, op) == SHARDOPT_OK);
  CHECK(f32 == expected);
  CHECK(last_error().empty());

  // bf16: the sums of these small integers are exact in bf16, so each result is the f32 one
  // rounded to nearest even (only an average over 3 ranks actually rounds).
  std::vector<uint16_t> bf16(kCount);
  for (int i = 0; i < kCount; ++i) bf16[i] = bf16_of(value_of(rank, i));
  REQUIRE(shardopt_comm_all_reduce(comm.get(), bf16.data(), kCount, SHARDOPT_DTYPE_BF16, op) == SHARDOPT_OK);
  for (int i = 0; i < kCount; ++i) {
    CAPTURE(i);
    CHECK(bf16[i] == bf16_of(expected[i]));
  }
  // count 0 with NULL is a no-op collective.
  CHECK(shardopt_comm_all_reduce(comm.get(), nullptr, 0, SHARDOPT_DTYPE_F32, op) == SHARDOPT_OK);
}

TEST_CASE("C broadcast from every root, a non-zero one included; all_gather in rank order", "[capi][collectives]") {
  CommHandle comm;
  const int size = comm.size(), rank = comm.rank();
  constexpr int kCount = 11;
  for (int root = size - 1; root >= 0; --root) {
    CAPTURE(root);
    std::vector<float> data(kCount);
    for (int i = 0; i < kCount; ++i) data[i] = value_of(rank, i);
    REQUIRE(shardopt_comm_broadcast(comm.get(), data.data(), kCount, SHARDOPT_DTYPE_F32, root) == SHARDOPT_OK);
    for (int i = 0; i < kCount; ++i) CHECK(data[i] == value_of(root, i));
    // Raw bytes: a record of any size.
    char text[24] = {};
    if (rank == root) std::snprintf(text, sizeof text, "from rank %d", root);
    REQUIRE(shardopt_comm_broadcast(comm.get(), text, sizeof text, SHARDOPT_DTYPE_BYTE, root) == SHARDOPT_OK);
    CHECK(std::string(text) == "from rank " + std::to_string(root));
  }
  std::vector<float> mine(kCount), all(static_cast<std::size_t>(kCount) * size, -1.0f);
  for (int i = 0; i < kCount; ++i) mine[i] = value_of(rank, i);
  REQUIRE(shardopt_comm_all_gather(comm.get(), mine.data(), all.data(), kCount, SHARDOPT_DTYPE_F32) == SHARDOPT_OK);
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < kCount; ++i) CHECK(all[static_cast<std::size_t>(r) * kCount + i] == value_of(r, i));
  }
  REQUIRE(shardopt_comm_barrier(comm.get()) == SHARDOPT_OK);
}

TEST_CASE("bad collective arguments give the named status on every rank", "[capi][collectives][errors]") {
  CommHandle comm;
  const int size = comm.size(), rank = comm.rank();
  const int culprit = size - 1;  // one rank alone passes the bad value
  float data[4] = {1, 2, 3, 4};
  float gathered[16] = {};

  SECTION("a NULL buffer on one rank") {
    CHECK(shardopt_comm_all_reduce(comm.get(), rank == culprit ? nullptr : data, 4, SHARDOPT_DTYPE_F32,
                                   SHARDOPT_REDUCE_SUM) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_comm_all_reduce: rank " + std::to_string(culprit) +
                              " passed a NULL buffer with count 4");
    CHECK(shardopt_comm_all_gather(comm.get(), data, rank == culprit ? nullptr : gathered, 4, SHARDOPT_DTYPE_F32) ==
          SHARDOPT_ERR_NULL_POINTER);
    CHECK(contains(last_error(), "passed a NULL recv with count 4"));
  }
  SECTION("a negative count") {
    CHECK(shardopt_comm_broadcast(comm.get(), data, rank == culprit ? -2 : 4, SHARDOPT_DTYPE_F32, 0) ==
          SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error() == "shardopt_comm_broadcast: rank " + std::to_string(culprit) + " passed a negative count (-2)");
  }
  SECTION("a bad root") {
    const int bad = rank == culprit ? size : 0;
    CHECK(shardopt_comm_broadcast(comm.get(), data, 4, SHARDOPT_DTYPE_F32, bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "rank " + std::to_string(culprit) + " passed root " + std::to_string(size) +
                                     ", outside the communicator's ranks 0.." + std::to_string(size - 1)));
    CHECK(shardopt_comm_broadcast(comm.get(), data, 4, SHARDOPT_DTYPE_F32, -1) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "rank 0 passed root -1"));
  }
  SECTION("an op or dtype that is no enumerator, and bytes to a reduction") {
    CHECK(shardopt_comm_all_reduce(comm.get(), data, 4, SHARDOPT_DTYPE_F32,
                                   static_cast<shardopt_reduce_op>(rank == culprit ? 9 : 0)) ==
          SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "passed op 9, which is not a shardopt_reduce_op (0..2)"));
    CHECK(shardopt_comm_all_gather(comm.get(), data, gathered, 1, static_cast<shardopt_dtype>(-1)) ==
          SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "rank 0 passed dtype -1, which is not a shardopt_dtype (0..3)"));
    CHECK(shardopt_comm_all_reduce(comm.get(), data, 4, SHARDOPT_DTYPE_BYTE, SHARDOPT_REDUCE_MAX) ==
          SHARDOPT_ERR_UNSUPPORTED);
    CHECK(contains(last_error(), "dtype SHARDOPT_DTYPE_BYTE to a reduction"));
  }
  SECTION("valid arguments that differ between ranks") {
    if (size > 1) {
      CHECK(shardopt_comm_all_reduce(comm.get(), data, rank == culprit ? 3 : 4, SHARDOPT_DTYPE_F32,
                                     SHARDOPT_REDUCE_SUM) == SHARDOPT_ERR_MISMATCH);
      CHECK(last_error() == "shardopt_comm_all_reduce: ranks disagree on count: rank 0 has 4, rank " +
                                std::to_string(culprit) + " has 3");
      CHECK(shardopt_comm_broadcast(comm.get(), data, 4, SHARDOPT_DTYPE_F32, rank == culprit ? 1 : 0) ==
            SHARDOPT_ERR_MISMATCH);
      CHECK(contains(last_error(), "ranks disagree on root"));
      CHECK(shardopt_comm_all_reduce(comm.get(), data, 4, SHARDOPT_DTYPE_F32,
                                     rank == culprit ? SHARDOPT_REDUCE_MAX : SHARDOPT_REDUCE_SUM) ==
            SHARDOPT_ERR_MISMATCH);
      CHECK(contains(last_error(), "ranks disagree on op: rank 0 has 0"));
      // Ranks in different collectives are told so, rather than matching each other's traffic.
      const shardopt_status status =
          rank == culprit ? shardopt_comm_broadcast(comm.get(), data, 4, SHARDOPT_DTYPE_F32, 0)
                          : shardopt_comm_all_reduce(comm.get(), data, 4, SHARDOPT_DTYPE_F32, SHARDOPT_REDUCE_SUM);
      CHECK(status == SHARDOPT_ERR_MISMATCH);
      CHECK(contains(last_error(), "ranks are in different calls"));
    }
  }
  // The buffers were never touched by the refused calls, and the communicator still works.
  CHECK(data[0] == 1.0f);
  CHECK(data[3] == 4.0f);
  REQUIRE(shardopt_comm_all_reduce(comm.get(), data, 4, SHARDOPT_DTYPE_F32, SHARDOPT_REDUCE_SUM) == SHARDOPT_OK);
  CHECK(data[3] == 4.0f * static_cast<float>(size));
  // Handles are checked before anything is communicated.
  CHECK(shardopt_comm_all_reduce(nullptr, data, 4, SHARDOPT_DTYPE_F32, SHARDOPT_REDUCE_SUM) ==
        SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_comm_broadcast(reinterpret_cast<shardopt_comm_t>(data), data, 4, SHARDOPT_DTYPE_F32, 0) ==
        SHARDOPT_ERR_BAD_HANDLE);
}
