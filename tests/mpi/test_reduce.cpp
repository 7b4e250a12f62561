// tests/mpi/test_reduce.cpp — the MPI communicator's reductions: rooted reduce, f32/bf16/f16 with sum, avg and max, async forms, and their errors.
//
// Expected values are computed here, independently of kernels/precision.hpp: 16-bit values are
// modelled as doubles rounded to the format's significand width with nearbyint (round to
// nearest even). Most inputs are small multiples of 1/4, whose sums are exact in every dtype, so
// any order MPI sums in gives one exact answer; the inexact tests accept exactly the results of
// the possible summation orders, each step rounded to the dtype.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "mpi_test_support.hpp"

using shardopt::Communicator;
using shardopt::DType;
using shardopt::ErrorCode;
using shardopt::ReduceOp;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

// Rounds x to `bits` significand bits, nearest even, with subnormals below 2^min_exponent.
double round_to_bits(double x, int bits, int min_exponent) {
  if (x == 0 || !std::isfinite(x)) return x;
  const int exponent = std::max(std::ilogb(x), min_exponent);
  return std::ldexp(std::nearbyint(std::ldexp(x, bits - 1 - exponent)), exponent - (bits - 1));
}

double ulp_of(double x, int bits, int min_exponent) {
  const int exponent = x == 0 ? min_exponent : std::max(std::ilogb(x), min_exponent);
  return std::ldexp(1.0, exponent - (bits - 1));
}

struct F32 {
  using Word = float;
  static constexpr DType dtype = DType::f32;
  static constexpr int bits = 24;
  static constexpr int min_exponent = -126;
  static Word encode(double v) {
    const float f = static_cast<float>(v);
    REQUIRE(static_cast<double>(f) == v);
    return f;
  }
  static double decode(Word w) { return w; }
  static Word nan() { return std::numeric_limits<float>::quiet_NaN(); }
};

struct Bf16 {
  using Word = uint16_t;
  static constexpr DType dtype = DType::bf16;
  static constexpr int bits = 8;
  static constexpr int min_exponent = -126;
  static Word encode(double v) {  // v must be a bf16 value
    const float f = static_cast<float>(v);
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    REQUIRE(static_cast<double>(f) == v);
    REQUIRE((u & 0xFFFFu) == 0);
    return static_cast<Word>(u >> 16);
  }
  static double decode(Word w) {
    const uint32_t u = static_cast<uint32_t>(w) << 16;
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static Word nan() { return 0x7FC0; }
};

struct F16 {
  using Word = uint16_t;
  static constexpr DType dtype = DType::f16;
  static constexpr int bits = 11;
  static constexpr int min_exponent = -14;
  static Word encode(double v) {  // v must be an f16 value (finite)
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::fabs(v);
    if (a == 0) return sign;
    const int e = std::ilogb(a);
    Word word = 0;
    if (e >= -14) {
      const double mantissa = std::ldexp(a, -e) - 1.0;  // in [0, 1)
      const double scaled = std::ldexp(mantissa, 10);
      REQUIRE(scaled == std::floor(scaled));
      REQUIRE(e <= 15);
      word = static_cast<Word>(((e + 15) << 10) | static_cast<int>(scaled));
    } else {
      const double scaled = std::ldexp(a, 24);
      REQUIRE(scaled == std::floor(scaled));
      word = static_cast<Word>(scaled);
    }
    return static_cast<Word>(sign | word);
  }
  static double decode(Word w) {
    const double sign = (w & 0x8000) ? -1.0 : 1.0;
    const int e = (w >> 10) & 0x1F;
    const int m = w & 0x3FF;
    if (e == 0) return sign * std::ldexp(m, -24);
    if (e == 31) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    return sign * std::ldexp(1024 + m, e - 25);
  }
  static Word nan() { return 0x7E00; }
};

template <typename T>
double round_to(double x) {
  return round_to_bits(x, T::bits, T::min_exponent);
}

// Rank r's element i: a multiple of 1/4 up to 7 in magnitude, negative for every third i, so
// that every partial sum over up to 4 ranks is exact in bf16 (8 significand bits) and f16.
double exact_value(int rank, int64_t i) {
  const double magnitude = static_cast<double>((i % 7) + 1) * (rank + 1) * 0.25;
  return i % 3 == 0 ? -magnitude : magnitude;
}

template <typename T>
std::vector<typename T::Word> exact_words(int rank, int64_t begin, int64_t count) {
  std::vector<typename T::Word> words(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) words[static_cast<std::size_t>(i)] = T::encode(exact_value(rank, begin + i));
  return words;
}

// The reduction of exact_value over all ranks at index i, as the dtype's words.
template <typename T>
typename T::Word exact_expected(ReduceOp op, int ranks, int64_t i) {
  double sum = 0, max = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < ranks; ++r) {
    sum += exact_value(r, i);
    max = std::max(max, exact_value(r, i));
  }
  if (op == ReduceOp::max) return T::encode(max);
  if (op == ReduceOp::sum) return T::encode(sum);
  return T::encode(round_to<T>(sum / ranks));
}

template <typename T>
std::vector<typename T::Word> exact_expected(ReduceOp op, int ranks, int64_t begin, int64_t count) {
  std::vector<typename T::Word> words(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) words[static_cast<std::size_t>(i)] = exact_expected<T>(op, ranks, begin + i);
  return words;
}

// Bitwise comparison (floats too: -0 and NaN must match exactly).
template <typename Word>
bool same_bits(const std::vector<Word>& a, const std::vector<Word>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Word)) == 0);
}

const char* op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::avg ? "avg" : "max";
}

const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

}  // namespace

TEMPLATE_TEST_CASE("reduce to every root, in place and out of place", "[comm][reduce]", F32, Bf16, F16) {
  using Word = typename TestType::Word;
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  const Word sentinel = TestType::encode(-1000.0);
  for (int64_t count : {0, 1, 7, 300}) {
    for (ReduceOp op : kOps) {
      const std::vector<Word> mine = exact_words<TestType>(me, 0, count);
      const std::vector<Word> expected = exact_expected<TestType>(op, n, 0, count);
      for (int root = 0; root < n; ++root) {
        CAPTURE(count, op_name(op), root);
        // Out of place: only the root's recv is written, and send never is.
        std::vector<Word> send = mine;
        std::vector<Word> recv(static_cast<std::size_t>(count), sentinel);
        comm.reduce(send.data(), recv.data(), count, TestType::dtype, op, root);
        REQUIRE(same_bits(send, mine));
        if (me == root) {
          REQUIRE(same_bits(recv, expected));
        } else {
          REQUIRE(same_bits(recv, std::vector<Word>(static_cast<std::size_t>(count), sentinel)));
        }
        // In place on the root (send == recv everywhere; only the root's buffer changes).
        std::vector<Word> buffer = mine;
        comm.reduce(buffer.data(), buffer.data(), count, TestType::dtype, op, root);
        REQUIRE(same_bits(buffer, me == root ? expected : mine));
        // The nonblocking form gives the same.
        std::vector<Word> async_recv(static_cast<std::size_t>(count), sentinel);
        auto pending = comm.reduce_async(mine.data(), async_recv.data(), count, TestType::dtype, op, root);
        pending->wait();
        pending->wait();  // a second wait is harmless (and does not divide twice)
        if (me == root) REQUIRE(same_bits(async_recv, expected));
      }
    }
  }
}

TEMPLATE_TEST_CASE("all_reduce and reduce_scatter, sync and async, on every dtype and op", "[comm][reduce]", F32,
                   Bf16, F16) {
  using Word = typename TestType::Word;
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  for (int64_t count : {0, 1, 5, 129}) {
    for (ReduceOp op : kOps) {
      CAPTURE(count, op_name(op));
      const std::vector<Word> whole_expected = exact_expected<TestType>(op, n, 0, count);

      std::vector<Word> buffer = exact_words<TestType>(me, 0, count);
      comm.all_reduce(buffer.data(), count, TestType::dtype, op);
      REQUIRE(same_bits(buffer, whole_expected));
      buffer = exact_words<TestType>(me, 0, count);
      auto pending = comm.all_reduce_async(buffer.data(), count, TestType::dtype, op);
      pending->wait();
      REQUIRE(same_bits(buffer, whole_expected));

      // reduce_scatter: this rank's block of the reduction of n*count elements.
      const std::vector<Word> send = exact_words<TestType>(me, 0, count * n);
      const std::vector<Word> block_expected = exact_expected<TestType>(op, n, me * count, count);
      std::vector<Word> recv(static_cast<std::size_t>(count));
      comm.reduce_scatter(send.data(), recv.data(), count, TestType::dtype, op);
      REQUIRE(same_bits(recv, block_expected));
      std::vector<Word> async_recv(static_cast<std::size_t>(count));
      auto scatter = comm.reduce_scatter_async(send.data(), async_recv.data(), count, TestType::dtype, op);
      scatter->wait();
      REQUIRE(same_bits(async_recv, block_expected));
    }
  }
}

namespace {

// Every value that summing `leaves` can give in some order and association, each addition
// rounded to the dtype (MPI may combine ranks' contributions in any tree).
template <typename T>
std::set<double> possible_sums(const std::vector<double>& leaves) {
  const unsigned full = (1u << leaves.size()) - 1;
  std::vector<std::set<double>> sums(full + 1);
  for (unsigned mask = 1; mask <= full; ++mask) {
    if ((mask & (mask - 1)) == 0) {
      sums[mask].insert(leaves[static_cast<std::size_t>(__builtin_ctz(mask))]);
      continue;
    }
    for (unsigned part = (mask - 1) & mask; part != 0; part = (part - 1) & mask) {
      for (double a : sums[part]) {
        for (double b : sums[mask ^ part]) sums[mask].insert(round_to<T>(a + b));
      }
    }
  }
  return sums[full];
}

// Rank r's inexact inputs: values of the dtype in [1, 2), the same on every rank that asks.
template <typename T>
std::vector<double> inexact_values(int rank, int64_t count) {
  std::mt19937 gen(static_cast<uint32_t>(4242 + 17 * rank));
  std::uniform_real_distribution<double> dist(1.0, 2.0);
  std::vector<double> values(static_cast<std::size_t>(count));
  for (double& v : values) v = std::min(round_to<T>(dist(gen)), 2.0 - ulp_of(1.0, T::bits, T::min_exponent));
  return values;
}

}  // namespace

TEMPLATE_TEST_CASE("inexact 16-bit sums are a rounded sum in some order, within one ulp of the exact sum",
                   "[comm][reduce]", Bf16, F16) {
  using Word = typename TestType::Word;
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  const int64_t count = 257;
  std::vector<std::vector<double>> all(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = inexact_values<TestType>(r, count);
  std::vector<Word> mine(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) mine[static_cast<std::size_t>(i)] = TestType::encode(all[static_cast<std::size_t>(me)][static_cast<std::size_t>(i)]);

  auto check_sums = [&](const std::vector<Word>& sums, const std::vector<Word>& avgs, const char* collective) {
    for (int64_t i = 0; i < count; ++i) {
      std::vector<double> leaves;
      double exact = 0;
      for (int r = 0; r < n; ++r) {
        leaves.push_back(all[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]);
        exact += leaves.back();  // exact in double: a few 11-bit values of similar size
      }
      const std::set<double> possible = possible_sums<TestType>(leaves);
      const double got = TestType::decode(sums[static_cast<std::size_t>(i)]);
      const double nearest = round_to<TestType>(exact);
      CAPTURE(collective, i, got, nearest, exact);
      REQUIRE(possible.count(got) == 1);
      REQUIRE(std::fabs(got - nearest) <=
              ulp_of(std::max(std::fabs(got), std::fabs(nearest)), TestType::bits, TestType::min_exponent));
      // avg: that sum divided by the world size, rounded to nearest even.
      const double avg = TestType::decode(avgs[static_cast<std::size_t>(i)]);
      std::set<double> possible_avgs;
      for (double s : possible) possible_avgs.insert(round_to<TestType>(s / n));
      REQUIRE(possible_avgs.count(avg) == 1);
      if (n <= 2) REQUIRE(avg == round_to<TestType>(got / n));
    }
  };

  std::vector<Word> sum = mine, avg = mine;
  comm.all_reduce(sum.data(), count, TestType::dtype, ReduceOp::sum);
  comm.all_reduce(avg.data(), count, TestType::dtype, ReduceOp::avg);
  check_sums(sum, avg, "all_reduce");

  std::vector<Word> reduced_sum(static_cast<std::size_t>(count)), reduced_avg(static_cast<std::size_t>(count));
  comm.reduce(mine.data(), reduced_sum.data(), count, TestType::dtype, ReduceOp::sum, n - 1);
  comm.reduce(mine.data(), reduced_avg.data(), count, TestType::dtype, ReduceOp::avg, n - 1);
  if (me == n - 1) check_sums(reduced_sum, reduced_avg, "reduce");

  // reduce_scatter of one block per rank, each block the same inputs: every rank checks its own.
  std::vector<Word> send;
  for (int r = 0; r < n; ++r) send.insert(send.end(), mine.begin(), mine.end());
  std::vector<Word> scattered_sum(static_cast<std::size_t>(count)), scattered_avg(static_cast<std::size_t>(count));
  comm.reduce_scatter(send.data(), scattered_sum.data(), count, TestType::dtype, ReduceOp::sum);
  comm.reduce_scatter(send.data(), scattered_avg.data(), count, TestType::dtype, ReduceOp::avg);
  check_sums(scattered_sum, scattered_avg, "reduce_scatter");
}

TEMPLATE_TEST_CASE("avg is bitwise the same from all_reduce, reduce_scatter and reduce", "[comm][reduce]", F32, Bf16,
                   F16) {
  using Word = typename TestType::Word;
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  const int64_t count = 513;
  // Exact sums at every world size; inexact (random) inputs where the sums themselves cannot
  // depend on the order: 1 or 2 ranks.
  std::vector<Word> mine = exact_words<TestType>(me, 0, count);
  if (n <= 2) {
    const std::vector<double> values = inexact_values<TestType>(me, count);
    for (int64_t i = 0; i < count; i += 2) mine[static_cast<std::size_t>(i)] = TestType::encode(values[static_cast<std::size_t>(i)]);
  }
  std::vector<Word> all_reduced = mine;
  comm.all_reduce(all_reduced.data(), count, TestType::dtype, ReduceOp::avg);
  std::vector<Word> send;
  for (int r = 0; r < n; ++r) send.insert(send.end(), mine.begin(), mine.end());
  std::vector<Word> scattered(static_cast<std::size_t>(count));
  comm.reduce_scatter_async(send.data(), scattered.data(), count, TestType::dtype, ReduceOp::avg)->wait();
  REQUIRE(same_bits(scattered, all_reduced));
  for (int root = 0; root < n; ++root) {
    std::vector<Word> reduced = mine;
    comm.reduce(reduced.data(), reduced.data(), count, TestType::dtype, ReduceOp::avg, root);
    if (me == root) REQUIRE(same_bits(reduced, all_reduced));
  }
}

TEMPLATE_TEST_CASE("16-bit max: NaN wins and +0 beats -0, whatever the order", "[comm][reduce]", Bf16, F16) {
  using Word = typename TestType::Word;
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  const Word plus_zero = 0x0000, minus_zero = 0x8000;
  // [0]: NaN on the last rank; [1]: +0 on rank 0 only; [2]: -0 everywhere; [3]: -0 on rank 0,
  // +0 elsewhere; [4]: -1.5 everywhere but rank 0's -2.
  std::vector<Word> buffer = {me == n - 1 ? TestType::nan() : TestType::encode(1.0), me == 0 ? plus_zero : minus_zero,
                              minus_zero, me == 0 ? minus_zero : plus_zero,
                              TestType::encode(me == 0 ? -2.0 : -1.5)};
  std::vector<Word> reduced(buffer.size());
  comm.reduce(buffer.data(), reduced.data(), 5, TestType::dtype, ReduceOp::max, 0);
  comm.all_reduce(buffer.data(), 5, TestType::dtype, ReduceOp::max);
  for (const auto* result : {&buffer, &reduced}) {
    if (result == &reduced && me != 0) continue;
    REQUIRE(std::isnan(TestType::decode((*result)[0])));
    REQUIRE((*result)[1] == plus_zero);
    REQUIRE((*result)[2] == minus_zero);
    REQUIRE((*result)[3] == (n == 1 ? minus_zero : plus_zero));
    REQUIRE((*result)[4] == TestType::encode(n == 1 ? -2.0 : -1.5));
  }
}

TEST_CASE("several reduce_async in flight complete in any wait order", "[comm][reduce]") {
  Communicator& comm = *world();
  const int n = comm.size(), me = comm.rank();
  const int64_t count = 1000;
  for (int order = 0; order < 3; ++order) {
    CAPTURE(order);
    std::vector<float> f32_recv(static_cast<std::size_t>(count), 0.f);
    std::vector<uint16_t> bf16_buffer = exact_words<Bf16>(me, 0, count);
    const std::vector<uint16_t> f16_send = exact_words<F16>(me, 0, count);
    std::vector<uint16_t> f16_recv(static_cast<std::size_t>(count), 0);
    const std::vector<float> f32_send = exact_words<F32>(me, 0, count);
    std::vector<float> all_reduced = exact_words<F32>(me, 0, count);
    // Started in the same order everywhere (MPI's rule), with different roots and dtypes.
    std::vector<std::unique_ptr<shardopt::PendingCollective>> pending;
    pending.push_back(comm.reduce_async(f32_send.data(), f32_recv.data(), count, DType::f32, ReduceOp::sum, 0));
    pending.push_back(comm.reduce_async(bf16_buffer.data(), bf16_buffer.data(), count, DType::bf16, ReduceOp::max, n - 1));
    pending.push_back(comm.reduce_async(f16_send.data(), f16_recv.data(), count, DType::f16, ReduceOp::avg, n / 2));
    pending.push_back(comm.all_reduce_async(all_reduced.data(), count, DType::f32, ReduceOp::avg));
    // Waited in an order that depends on the test round and on the rank.
    std::vector<std::size_t> waits = {0, 1, 2, 3};
    if (order == 1) std::reverse(waits.begin(), waits.end());
    if (order == 2) std::rotate(waits.begin(), waits.begin() + me % 4, waits.end());
    for (std::size_t w : waits) pending[w]->wait();

    if (me == 0) REQUIRE(same_bits(f32_recv, exact_expected<F32>(ReduceOp::sum, n, 0, count)));
    if (me == n - 1) REQUIRE(same_bits(bf16_buffer, exact_expected<Bf16>(ReduceOp::max, n, 0, count)));
    if (me == n / 2) REQUIRE(same_bits(f16_recv, exact_expected<F16>(ReduceOp::avg, n, 0, count)));
    REQUIRE(same_bits(all_reduced, exact_expected<F32>(ReduceOp::avg, n, 0, count)));
  }
}

TEST_CASE("bad reduction arguments are refused, naming the operation, dtype and reduce op", "[comm][reduce]") {
  Communicator& comm = *world();
  std::vector<uint16_t> words(4, 0);
  const auto bad_op = static_cast<ReduceOp>(7);
  const auto bad_dtype = static_cast<DType>(9);

  auto [code, what] = error_of([&] { comm.all_reduce(words.data(), 4, DType::bf16, bad_op); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("all_reduce") && Catch::Contains("reduce op unknown (7)") &&
                         Catch::Contains("dtype bf16"));
  std::tie(code, what) = error_of([&] { comm.reduce(words.data(), words.data(), 4, bad_dtype, ReduceOp::max, 0); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("reduce over MPI") && Catch::Contains("reduce op max") &&
                         Catch::Contains("dtype unknown-dtype (9)"));
  std::tie(code, what) =
      error_of([&] { comm.reduce_scatter_async(words.data(), words.data(), 1, DType::f16, bad_op); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("reduce_scatter") && Catch::Contains("unknown (7)") && Catch::Contains("f16"));
  std::tie(code, what) =
      error_of([&] { comm.reduce_async(words.data(), words.data(), 4, bad_dtype, ReduceOp::avg, 0); });
  REQUIRE(code == ErrorCode::unsupported);
  REQUIRE_THAT(what, Catch::Contains("avg") && Catch::Contains("unknown-dtype"));

  for (int root : {-1, comm.size()}) {
    std::tie(code, what) = error_of([&] { comm.reduce(words.data(), words.data(), 4, DType::bf16, ReduceOp::sum, root); });
    REQUIRE(code == ErrorCode::invalid_argument);
    REQUIRE_THAT(what, Catch::Contains("reduce: root " + std::to_string(root) + " is not a rank of this"));
  }
  std::tie(code, what) = error_of([&] { comm.reduce(words.data(), words.data(), -1, DType::bf16, ReduceOp::sum, 0); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(what, Catch::Contains("reduce: negative count -1"));
  // Nothing was started: the communicator is in step on every rank.
  comm.barrier();
}
