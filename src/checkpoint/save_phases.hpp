// src/checkpoint/save_phases.hpp — a save in three phases (start, write, finish), so a background save runs exactly the code of save().
//
// start_save: collective, on the calling thread. Checks, makes the directory, agrees on the
//   save's identity, and captures everything later phases need from the optimizer: the
//   manifest (steps, groups, loss scale, layout; all but the files' sizes and CRCs) and
//   where each byte of this rank's shard file comes from (pointers into the live buffers).
// write_own_shard_file: local, any thread, never throws, never communicates. Reads the live
//   buffers the ticket points to: nothing may change them until it reports kSourcesRead.
// finish_save: collective, on the calling thread. The ranks agree on the files, prove the
//   checkpoint together (each reads back its own file), and rank 0 commits the manifest
//   (sharded_save.cpp's steps 2 to 4).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/collective.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/store.hpp"

namespace shardopt {
namespace checkpoint {

// `count` elements of the shard file from `data` (of `dtype`: bf16/f16 widened to f32, bytes
// written as they are), or f32 zeros when `data` is null.
struct ShardSource {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t count = 0;
};

// What one save captured at its start.
struct SaveTicket {
  std::string dir;
  std::string what;  // "save to '<dir>'": the prefix of every error of this save
  int rank = 0;
  bool created_dir = false;
  uint64_t generation = 0;
  std::string save_id;
  int count = 1;          // shard files in this save
  int file_index = 0;     // this rank's file
  bool writes = false;    // this rank writes a file (every rank when sharded, else rank 0)
  std::string own_path;
  int64_t shard_numel = 0;
  int64_t frozen_numel = 0;
  std::vector<std::string> kinds;
  FileMoments moments;               // how this rank's file keeps its moments (store.hpp)
  std::vector<ShardSource> sources;  // in file order, after the header
  // Then the 8-bit moments (host memory; q8 runs on CPU only), written directly, never staged.
  std::vector<ShardSource> q8_sources;
  int64_t source_bytes = 0;          // of the data section: what the writer reads and writes
  int widen_threads = 0;             // for bf16/f16 values (config.cpu_threads; 1 in the background)
  Manifest manifest;                 // every rank's (rank 0's is committed); files' bytes and CRCs filled in by finish_save
  // Device state (or staging forced by a test): the sources are read through this engine in
  // bounded chunks; null: read directly. Made at start_save, so its copies follow the work
  // enqueued before the save on the optimizer's stream.
  std::shared_ptr<CopyEngine> engine;
  Outcome staging_failure;  // the engine could not be made: the write reports this
};

// Points of write_own_shard_file, reported to its observer in this order (kHalfWritten only when
// there are sources to write).
enum class WritePoint {
  kHalfWritten,  // half of the data section handed to the file
  kSourcesRead,  // every source read and handed to the kernel; the live buffers are free again
  kCommitted,    // the file fsynced and renamed to its final name
};

SaveTicket start_save(const OptimizerParts& parts, const std::string& dir);
// The file's size and CRC in value0/value1, or the failure. `observe` (may be empty) runs at each
// WritePoint reached; kSourcesRead is reported even when the write fails.
Outcome write_own_shard_file(const SaveTicket& ticket, const std::function<void(WritePoint)>& observe);
void finish_save(Communicator& comm, const SaveTicket& ticket, const Outcome& written);
// Removes this rank's file of a save that will not be finished, and the directory the save
// created if it is empty. Local, never raises.
void abandon_save(const SaveTicket& ticket) noexcept;

}  // namespace checkpoint
}  // namespace shardopt
