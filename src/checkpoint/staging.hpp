// src/checkpoint/staging.hpp — moving a list of memory regions to or from the host in bounded, double-buffered chunks through a copy engine.
//
// A region is `count` elements of one dtype in the optimizer's memory (host, or a CUDA
// device). The regions are laid end to end and cut into chunks of at most one staging slot:
// a chunk packs whole elements of consecutive regions (each piece at an offset aligned to its
// element size), so chunk boundaries fall inside tensors wherever the slot size puts them.
// stage_out copies chunk k+1 into one slot while the caller consumes chunk k from the other
// (writes it to a file, broadcasts it); stage_in lets the caller fill chunk k+1 (reads it from
// a file) while chunk k is copied to the regions. Every rank computing the same regions gets
// the same chunks (ChunkPlanner), which consolidation relies on to agree on its broadcasts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "checkpoint/copy_engine.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace optim {
class DeviceContext;
}
namespace checkpoint {

// Host memory per staging slot by default; a checkpoint's staging holds two.
constexpr std::size_t kDefaultStagingBytes = std::size_t{4} << 20;

// How checkpoints stage state. Optimizers on a device always stage (slots of slot_bytes, or the
// default). CPU optimizers copy directly unless a test forces staging: with slot_bytes set
// here, or through SHARDOPT_TEST_CKPT_STAGING_BYTES=<bytes> in the environment (values below 4
// mean 4, one f32 element), so that CI runs the chunking and double buffering on the CPU.
struct StagingSettings {
  std::size_t slot_bytes = 0;          // 0: the environment's, else kDefaultStagingBytes
  std::shared_ptr<CopyStats> stats;    // every engine of this optimizer adds its calls here
};

// The engine a checkpoint operation of this optimizer stages through, or null when it copies
// directly (CPU state, no staging forced).
std::unique_ptr<CopyEngine> staging_engine(const optim::DeviceContext& dev, const StagingSettings& settings);
// An engine for operations that always work in chunks (consolidation): staging_engine's, or a
// host engine with default slots.
std::unique_ptr<CopyEngine> chunking_engine(const optim::DeviceContext& dev, const StagingSettings& settings);

struct StagedRegion {
  // stage_out: the source (null: zeros); stage_in: the destination (null: nothing is copied).
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;
};

struct StagedPiece {
  std::size_t region = 0;
  int64_t first = 0;  // element of the region
  int64_t count = 0;
  char* host = nullptr;  // inside the chunk's slot, aligned to the element size
};

struct StagedChunk {
  char* host = nullptr;   // the slot
  std::size_t bytes = 0;  // used, from the slot's start (alignment gaps included)
  std::vector<StagedPiece> pieces;
};

// The chunks of `regions` for slots of `slot_bytes`, one after the other.
class ChunkPlanner {
 public:
  ChunkPlanner(const std::vector<StagedRegion>& regions, std::size_t slot_bytes);
  // Fills `chunk` with the next chunk's pieces placed in `slot`; false when none is left.
  bool next(char* slot, StagedChunk& chunk);

 private:
  const std::vector<StagedRegion>& regions_;
  std::size_t slot_bytes_;
  std::size_t region_ = 0;
  int64_t offset_ = 0;  // elements of regions_[region_] already planned
};

// The regions' bytes reach `consume` chunk by chunk, in order.
void stage_out(CopyEngine& engine, const std::vector<StagedRegion>& regions,
               const std::function<void(const StagedChunk&)>& consume);
// `produce` fills each chunk's pieces on the host; they are copied into the regions. Returns
// once every copy has finished.
void stage_in(CopyEngine& engine, const std::vector<StagedRegion>& regions,
              const std::function<void(const StagedChunk&)>& produce);

}  // namespace checkpoint
}  // namespace shardopt
