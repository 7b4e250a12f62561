// src/checkpoint/staging.cpp — the chunk plan, the double-buffered stage_out / stage_in loops, and the choice of engine.
#include "checkpoint/staging.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.hpp"
#include "optim/device_context.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// SHARDOPT_TEST_CKPT_STAGING_BYTES, or 0 when unset.
std::size_t forced_by_environment() {
  const char* value = std::getenv("SHARDOPT_TEST_CKPT_STAGING_BYTES");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long long bytes = std::strtoll(value, &end, 10);
  SHARDOPT_CHECK(end != nullptr && *end == '\0' && bytes > 0, invalid_argument,
                 "SHARDOPT_TEST_CKPT_STAGING_BYTES='{}' is not a positive number of bytes", value);
  return static_cast<std::size_t>(bytes);
}

std::size_t forced_slot_bytes(const StagingSettings& settings) {
  const std::size_t forced = settings.slot_bytes != 0 ? settings.slot_bytes : forced_by_environment();
  return forced == 0 ? 0 : std::max(forced, sizeof(float));
}

std::size_t element_bytes(DType dtype) { return dtype_size(dtype); }

char* element_at(void* base, int64_t index, DType dtype) {
  return static_cast<char*>(base) + index * static_cast<int64_t>(element_bytes(dtype));
}

}  // namespace

std::unique_ptr<CopyEngine> staging_engine(const optim::DeviceContext& dev, const StagingSettings& settings) {
  const std::size_t forced = forced_slot_bytes(settings);
  const std::size_t slot_bytes = forced != 0 ? forced : kDefaultStagingBytes;
  if (dev.on_device()) {
    // The host waits here, once, for the device work so far (and, within the communicator's
    // timeout, for collectives the optimizer's stream waits on): a dead peer then fails the
    // checkpoint with a timeout instead of leaving a staging copy waiting forever.
    dev.synchronize("checkpoint staging");
    if (dev.device().is_cuda()) return make_device_copy_engine(dev.device(), dev.stream(), slot_bytes, settings.stats);
    // The device path over host memory (a host DeviceOps, in tests): host copies.
    return make_host_copy_engine(slot_bytes, settings.stats);
  }
  if (forced == 0) return nullptr;
  return make_host_copy_engine(forced, settings.stats);
}

std::unique_ptr<CopyEngine> chunking_engine(const optim::DeviceContext& dev, const StagingSettings& settings) {
  std::unique_ptr<CopyEngine> engine = staging_engine(dev, settings);
  return engine ? std::move(engine) : make_host_copy_engine(kDefaultStagingBytes, settings.stats);
}

ChunkPlanner::ChunkPlanner(const std::vector<StagedRegion>& regions, std::size_t slot_bytes)
    : regions_(regions), slot_bytes_(slot_bytes) {}

bool ChunkPlanner::next(char* slot, StagedChunk& chunk) {
  chunk.host = slot;
  chunk.bytes = 0;
  chunk.pieces.clear();
  std::size_t used = 0;
  while (region_ < regions_.size()) {
    const StagedRegion& r = regions_[region_];
    if (offset_ >= r.count) {
      ++region_;
      offset_ = 0;
      continue;
    }
    const std::size_t size = element_bytes(r.dtype);
    const std::size_t at = (used + size - 1) / size * size;
    if (at + size > slot_bytes_) break;
    const int64_t room = static_cast<int64_t>((slot_bytes_ - at) / size);
    const int64_t take = std::min(room, r.count - offset_);
    chunk.pieces.push_back(StagedPiece{region_, offset_, take, slot + at});
    used = at + static_cast<std::size_t>(take) * size;
    offset_ += take;
  }
  SHARDOPT_CHECK(!chunk.pieces.empty() || region_ >= regions_.size(), internal,
                 "checkpoint staging: a slot of {} bytes cannot hold one element", slot_bytes_);
  chunk.bytes = used;
  return !chunk.pieces.empty();
}

void stage_out(CopyEngine& engine, const std::vector<StagedRegion>& regions,
               const std::function<void(const StagedChunk&)>& consume) {
  ChunkPlanner plan(regions, engine.slot_bytes());
  StagedChunk chunks[CopyEngine::kSlots];
  // Plans the next chunk into `slot` and enqueues its copies; false when none is left.
  auto enqueue = [&](int slot) {
    StagedChunk& chunk = chunks[slot];
    if (!plan.next(engine.slot(slot), chunk)) return false;
    for (const StagedPiece& p : chunk.pieces) {
      const StagedRegion& r = regions[p.region];
      const std::size_t bytes = static_cast<std::size_t>(p.count) * element_bytes(r.dtype);
      if (r.data == nullptr) {
        std::memset(p.host, 0, bytes);
      } else {
        engine.to_host(slot, p.host, element_at(r.data, p.first, r.dtype), bytes);
      }
    }
    engine.fence(slot);
    return true;
  };
  int slot = 0;
  bool more = enqueue(slot);
  while (more) {
    // The other slot's chunk was consumed in the previous round: refill it while this one is used.
    const bool next = enqueue(1 - slot);
    engine.wait(slot);
    consume(chunks[slot]);
    slot = 1 - slot;
    more = next;
  }
}

void stage_in(CopyEngine& engine, const std::vector<StagedRegion>& regions,
              const std::function<void(const StagedChunk&)>& produce) {
  ChunkPlanner plan(regions, engine.slot_bytes());
  StagedChunk chunk;
  bool in_flight[CopyEngine::kSlots] = {};
  int slot = 0;
  while (plan.next(engine.slot(slot), chunk)) {
    // This slot's previous copies must be done before it is filled again; the other slot's
    // copies go on meanwhile.
    if (in_flight[slot]) engine.wait(slot);
    in_flight[slot] = false;
    produce(chunk);
    for (const StagedPiece& p : chunk.pieces) {
      const StagedRegion& r = regions[p.region];
      if (r.data == nullptr) continue;
      engine.to_device(slot, element_at(r.data, p.first, r.dtype), p.host,
                       static_cast<std::size_t>(p.count) * element_bytes(r.dtype));
    }
    engine.fence(slot);
    in_flight[slot] = true;
    slot = 1 - slot;
  }
  for (int s = 0; s < CopyEngine::kSlots; ++s) {
    if (in_flight[s]) engine.wait(s);
  }
}

}  // namespace checkpoint
}  // namespace shardopt
