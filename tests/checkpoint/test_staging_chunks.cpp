// tests/checkpoint/test_staging_chunks.cpp — the staging layer alone: chunk plans, stage_out / stage_in through the host copy engine, bounded copies and memory.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint/staging.hpp"

using namespace shardopt;
using namespace shardopt::checkpoint;

namespace {

// Mixed regions as a save stages them: bf16 parameter values, zero padding, f32 state, an empty
// region, odd lengths everywhere. Each element's bytes are distinct.
struct Regions {
  std::vector<uint16_t> half = std::vector<uint16_t>(37);
  std::vector<float> state_a = std::vector<float>(101);
  std::vector<float> state_b = std::vector<float>(3);
  std::vector<uint16_t> half_tail = std::vector<uint16_t>(5);
  std::vector<StagedRegion> list;
  Regions() {
    for (std::size_t i = 0; i < half.size(); ++i) half[i] = static_cast<uint16_t>(0x3c00 + i);
    for (std::size_t i = 0; i < state_a.size(); ++i) state_a[i] = 0.5f + static_cast<float>(i);
    for (std::size_t i = 0; i < state_b.size(); ++i) state_b[i] = -7.25f * static_cast<float>(i + 1);
    for (std::size_t i = 0; i < half_tail.size(); ++i) half_tail[i] = static_cast<uint16_t>(0xc000 + i);
    list = {{half.data(), DType::bf16, 37},     {nullptr, DType::f32, 11}, {state_a.data(), DType::f32, 101},
            {state_b.data(), DType::f32, 0},    {state_b.data(), DType::f32, 3},
            {half_tail.data(), DType::f16, 5}};
  }
  // Every region's bytes end to end (zeros for the null one): what stage_out must deliver.
  std::vector<char> concatenated() const {
    std::vector<char> out;
    auto append = [&](const void* p, std::size_t bytes) {
      const char* c = static_cast<const char*>(p);
      out.insert(out.end(), c, c + bytes);
    };
    append(half.data(), 37 * 2);
    out.insert(out.end(), 11 * 4, '\0');
    append(state_a.data(), 101 * 4);
    append(state_b.data(), 3 * 4);
    append(half_tail.data(), 5 * 2);
    return out;
  }
};

const std::size_t kSlotSizes[] = {4, 5, 6, 7, 13, 64, 4099, std::size_t{1} << 20};

}  // namespace

TEST_CASE("stage_out delivers every region's bytes in order, in chunks no larger than a slot", "[staging]") {
  for (std::size_t slot_bytes : kSlotSizes) {
    CAPTURE(slot_bytes);
    Regions r;
    auto stats = std::make_shared<CopyStats>();
    auto engine = make_host_copy_engine(slot_bytes, stats);
    std::vector<char> got;
    int64_t chunks = 0;
    int64_t expected_first[6] = {};
    stage_out(*engine, r.list, [&](const StagedChunk& chunk) {
      ++chunks;
      REQUIRE(chunk.bytes <= slot_bytes);
      REQUIRE(chunk.host == engine->slot(static_cast<int>((chunks - 1) % 2)));
      for (const StagedPiece& p : chunk.pieces) {
        const std::size_t size = dtype_size(r.list[p.region].dtype);
        REQUIRE(p.count > 0);
        REQUIRE(p.first == expected_first[p.region]);  // each region continues where it stopped
        expected_first[p.region] += p.count;
        REQUIRE((p.host - chunk.host) % static_cast<std::ptrdiff_t>(size) == 0);
        REQUIRE(static_cast<std::size_t>(p.host - chunk.host) + p.count * size <= chunk.bytes);
        got.insert(got.end(), p.host, p.host + p.count * size);
      }
    });
    REQUIRE(got == r.concatenated());
    for (std::size_t i = 0; i < r.list.size(); ++i) REQUIRE(expected_first[i] == r.list[i].count);
    // Only the regions with data are copied (zeros are filled in the slot), never over a slot.
    REQUIRE(stats->max_call_bytes <= static_cast<int64_t>(slot_bytes));
    REQUIRE(stats->bytes_copied == (37 * 2 + 101 * 4 + 3 * 4 + 5 * 2));
    REQUIRE(stats->to_device_calls == 0);
    // Two slots, each rounded up to whole cache lines so that both start 64-byte aligned.
    REQUIRE(stats->staging_bytes == static_cast<int64_t>(2 * ((slot_bytes + 63) / 64 * 64)));
    for (int s = 0; s < 2; ++s) REQUIRE(reinterpret_cast<std::uintptr_t>(engine->slot(s)) % 64 == 0);
    REQUIRE(stats->engines == 1);
    if (slot_bytes == 4) REQUIRE(chunks == 37 / 2 + 1 + 11 + 101 + 3 + 5 / 2 + 1);
    if (slot_bytes >= 37 * 2 + 11 * 4 + 101 * 4 + 3 * 4 + 5 * 2 + 2) REQUIRE(chunks == 1);
  }
}

TEST_CASE("stage_in fills every region from the chunks the caller produces", "[staging]") {
  for (std::size_t slot_bytes : kSlotSizes) {
    CAPTURE(slot_bytes);
    Regions source;
    Regions dest;
    std::fill(dest.half.begin(), dest.half.end(), 0);
    std::fill(dest.state_a.begin(), dest.state_a.end(), 0.f);
    std::fill(dest.state_b.begin(), dest.state_b.end(), 0.f);
    std::fill(dest.half_tail.begin(), dest.half_tail.end(), 0);
    auto stats = std::make_shared<CopyStats>();
    auto engine = make_host_copy_engine(slot_bytes, stats);
    stage_in(*engine, dest.list, [&](const StagedChunk& chunk) {
      REQUIRE(chunk.bytes <= slot_bytes);
      for (const StagedPiece& p : chunk.pieces) {
        const StagedRegion& from = source.list[p.region];
        const std::size_t size = dtype_size(from.dtype);
        if (from.data == nullptr) {
          std::memset(p.host, 0x5a, p.count * size);  // a region without a destination is not copied
        } else {
          std::memcpy(p.host, static_cast<const char*>(from.data) + p.first * size, p.count * size);
        }
      }
    });
    REQUIRE(dest.half == source.half);
    REQUIRE(dest.state_a == source.state_a);
    REQUIRE(dest.state_b == source.state_b);
    REQUIRE(dest.half_tail == source.half_tail);
    REQUIRE(stats->max_call_bytes <= static_cast<int64_t>(slot_bytes));
    REQUIRE(stats->bytes_copied == (37 * 2 + 101 * 4 + 3 * 4 + 5 * 2));
    REQUIRE(stats->to_host_calls == 0);
  }
}

TEST_CASE("the chunk plan is a function of the regions' sizes only", "[staging]") {
  // Consolidation's receivers plan without the sender's pointers: the chunks must be the same.
  Regions r;
  std::vector<StagedRegion> shapes = r.list;
  for (StagedRegion& s : shapes) s.data = nullptr;
  std::vector<char> slot(13);
  ChunkPlanner with_data(r.list, 13), without(shapes, 13);
  StagedChunk a, b;
  int chunks = 0;
  while (with_data.next(slot.data(), a)) {
    REQUIRE(without.next(slot.data(), b));
    REQUIRE(a.bytes == b.bytes);
    REQUIRE(a.pieces.size() == b.pieces.size());
    for (std::size_t i = 0; i < a.pieces.size(); ++i) {
      REQUIRE(a.pieces[i].region == b.pieces[i].region);
      REQUIRE(a.pieces[i].first == b.pieces[i].first);
      REQUIRE(a.pieces[i].count == b.pieces[i].count);
      REQUIRE(a.pieces[i].host == b.pieces[i].host);
    }
    ++chunks;
  }
  REQUIRE_FALSE(without.next(slot.data(), b));
  REQUIRE(chunks > 40);
}

TEST_CASE("a copy outside a staging slot is refused", "[staging]") {
  auto engine = make_host_copy_engine(16, nullptr);
  float values[8] = {};
  REQUIRE_THROWS_WITH(engine->to_host(0, engine->slot(0) + 8, values, 12), Catch::Contains("overrun staging slot 0"));
  REQUIRE_THROWS_WITH(engine->to_device(2, values, engine->slot(0), 4), Catch::Contains("no staging slot 2"));
  REQUIRE_THROWS_WITH(make_host_copy_engine(3, nullptr), Catch::Contains("cannot hold one element"));
}
