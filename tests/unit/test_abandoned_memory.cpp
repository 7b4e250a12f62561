// tests/unit/test_abandoned_memory.cpp — frees of memory that an abandoned collective still holds wait for the hold's release; other frees happen at once.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "checkpoint/copy_engine.hpp"
#include "comm/raw_collectives.hpp"
#include "core/abandoned_memory.hpp"
#include "core/flat_buffer.hpp"

using shardopt::core::AbandonedMemory;
using shardopt::core::ByteRange;

namespace {

// The registry is the process's: each case starts and ends with nothing held or deferred.
void require_clean(const AbandonedMemory& registry) {
  REQUIRE(registry.held_count() == 0);
  REQUIRE(registry.deferred_count() == 0);
}

}  // namespace

TEST_CASE("a free overlapping a held range waits for its release; others run at once", "[abandoned-memory]") {
  AbandonedMemory& registry = AbandonedMemory::process();
  require_clean(registry);
  char memory[256] = {};
  int freed_inside = 0;
  int freed_beside = 0;

  registry.free_or_defer(memory, 64, [&] { ++freed_inside; });
  REQUIRE(freed_inside == 1);  // nothing held: at once

  const ByteRange touched{memory + 32, 64};  // bytes [32, 96)
  const AbandonedMemory::Hold hold = registry.hold(&touched, 1);
  REQUIRE(registry.held_count() == 1);
  registry.free_or_defer(memory, 33, [&] { ++freed_inside; });        // [0, 33): overlaps by one byte
  registry.free_or_defer(memory + 96, 64, [&] { ++freed_beside; });   // [96, 160): adjacent only
  registry.free_or_defer(memory, 32, [&] { ++freed_beside; });        // [0, 32): adjacent only
  REQUIRE(freed_inside == 1);
  REQUIRE(freed_beside == 2);
  REQUIRE(registry.deferred_count() == 1);

  registry.release(hold);
  REQUIRE(freed_inside == 2);
  registry.release(hold);  // a second release is ignored
  REQUIRE(freed_inside == 2);
  require_clean(registry);
}

TEST_CASE("a free waits for every hold that overlaps it; release_all ends them all", "[abandoned-memory]") {
  AbandonedMemory& registry = AbandonedMemory::process();
  require_clean(registry);
  char memory[256] = {};
  const ByteRange send{memory, 16};
  const ByteRange recv{memory + 128, 16};
  const ByteRange pair[2] = {send, ByteRange{nullptr, 0}};  // an empty range holds nothing
  const AbandonedMemory::Hold first = registry.hold(pair, 2);
  const AbandonedMemory::Hold second = registry.hold(&recv, 1);
  int freed_whole = 0;
  int freed_recv = 0;
  registry.free_or_defer(memory, sizeof memory, [&] { ++freed_whole; });
  registry.free_or_defer(memory + 120, 16, [&] { ++freed_recv; });
  REQUIRE(registry.deferred_count() == 2);

  registry.release(first);
  REQUIRE(freed_whole == 0);  // recv is still held
  REQUIRE(freed_recv == 0);
  REQUIRE(registry.deferred_count() == 2);

  const AbandonedMemory::Hold third = registry.hold(&send, 1);
  registry.release_all();
  REQUIRE(freed_whole == 1);
  REQUIRE(freed_recv == 1);
  registry.release(second);  // already ended by release_all
  registry.release(third);
  require_clean(registry);
}

TEST_CASE("a FlatBuffer destroyed while an abandoned collective holds part of it stays allocated until the release",
          "[abandoned-memory]") {
  AbandonedMemory& registry = AbandonedMemory::process();
  require_clean(registry);
  auto buffer = std::make_unique<shardopt::core::FlatBuffer>(64);
  float* data = buffer->data();
  data[10] = 3.5f;
  const ByteRange touched{buffer->at(8), 4 * sizeof(float)};
  const AbandonedMemory::Hold hold = registry.hold(&touched, 1);
  buffer.reset();
  REQUIRE(registry.deferred_count() == 1);
  // Still allocated (under AddressSanitizer a freed buffer fails here): the late peer's write.
  data[10] = 7.25f;
  REQUIRE(data[10] == 7.25f);

  shardopt::core::FlatBuffer unrelated(64);  // freed at once
  unrelated = shardopt::core::FlatBuffer(32);
  REQUIRE(registry.deferred_count() == 1);

  registry.release(hold);
  require_clean(registry);
}

TEST_CASE("a collective that fails hands its vector to the registry; one that succeeds leaves it alone",
          "[abandoned-memory]") {
  AbandonedMemory& registry = AbandonedMemory::process();
  require_clean(registry);
  std::vector<uint64_t> kept(4, 2);
  REQUIRE(shardopt::comm::run_keeping_on_failure(kept, [] { return 5; }) == 5);
  REQUIRE(kept == std::vector<uint64_t>(4, 2));
  require_clean(registry);

  std::vector<uint64_t> buffer(16, 1);
  uint64_t* data = buffer.data();
  AbandonedMemory::Hold hold = 0;
  // As the MPI communicator does when a collective times out: it holds the request's memory.
  auto timed_out = [&] {
    const ByteRange touched{data + 8, 8 * sizeof(uint64_t)};
    hold = registry.hold(&touched, 1);
    throw std::runtime_error("timed out");
  };
  REQUIRE_THROWS_AS(shardopt::comm::run_keeping_on_failure(buffer, timed_out), std::runtime_error);
  REQUIRE(buffer.empty());
  REQUIRE(registry.deferred_count() == 1);
  // Still allocated (under AddressSanitizer a freed vector fails here): the late peer's write.
  data[9] = 7;
  REQUIRE(data[9] == 7);
  registry.release(hold);
  require_clean(registry);

  // A failure while nothing holds the memory frees it at once.
  std::vector<uint64_t> unheld(16, 1);
  REQUIRE_THROWS_AS(shardopt::comm::run_keeping_on_failure(unheld, [] { throw std::runtime_error("refused"); }),
                    std::runtime_error);
  REQUIRE(unheld.empty());
  require_clean(registry);
}

TEST_CASE("checkpoint staging slots destroyed while a collective holds them stay allocated until the release",
          "[abandoned-memory]") {
  AbandonedMemory& registry = AbandonedMemory::process();
  require_clean(registry);
  std::unique_ptr<shardopt::checkpoint::CopyEngine> engine = shardopt::checkpoint::make_host_copy_engine(256, nullptr);
  char* slot = engine->slot(1);
  const ByteRange touched{slot, 64};  // a consolidation chunk being received
  const AbandonedMemory::Hold hold = registry.hold(&touched, 1);
  engine.reset();
  REQUIRE(registry.deferred_count() == 1);
  slot[63] = 'x';  // still allocated
  REQUIRE(slot[63] == 'x');
  registry.release(hold);
  require_clean(registry);

  shardopt::checkpoint::make_host_copy_engine(256, nullptr).reset();  // nothing held: freed at once
  require_clean(registry);
}
