// src/averaging/local_sgd_checkpoint.cpp — checkpoints of PostLocalSGDOptimizer: one optimizer checkpoint per replica, the averager's state, and a commit record written last.
//
// dir/local_sgd.json names the save that counts. A save writes everything under a new
// dir/<save id>/ (replica-<k>/ holds replica k's own sharded checkpoint; outer-<r>.safetensors
// the outer optimizer's state of local rank r, identical in every replica, written by replica
// 0, with the layout it follows: outer_state_file.hpp), then world rank 0 replaces local_sgd.json
// atomically and removes older saves. A crash at any point leaves the record naming a complete
// save. The record is sealed as the optimizer's manifest is (sealed_json.hpp).
#include <random>

#include <fmt/format.h>

#include "averaging/local_sgd_save_ids.hpp"
#include "averaging/outer_state_file.hpp"
#include "averaging/post_local_sgd_impl.hpp"
#include "checkpoint/collective.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/json_reader.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/sealed_json.hpp"
#include "checkpoint/store.hpp"
#include "comm/agreement.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace averaging {

namespace {

using checkpoint::join_path;
using checkpoint::Outcome;

constexpr const char* kRecordName = "local_sgd.json";
constexpr const char* kFormat = "shardopt-local-sgd";
constexpr int kVersion = 1;
constexpr const char* kSealKey = "record_crc32c";

struct Record {
  uint64_t generation = 0;
  std::string save_id;
  int world_size = 0;
  int replica_size = 0;
  int replicas = 0;
  int64_t averager_step = 0;
  bool outer = false;
  int64_t outer_steps = 0;
  std::vector<OuterFile> outer_files;  // by local rank
};

std::string replica_dir(const std::string& save_id, int replica) {
  return fmt::format("{}/replica-{}", save_id, replica);
}
std::string outer_file_name(const std::string& save_id, int local_rank) {
  return fmt::format("{}/outer-{}.safetensors", save_id, local_rank);
}

std::string record_to_json(const Record& r) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const OuterFile& f : r.outer_files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  const nlohmann::ordered_json j{{"format", kFormat},
                                 {"version", kVersion},
                                 {"generation", r.generation},
                                 {"save_id", r.save_id},
                                 {"world_size", r.world_size},
                                 {"replica_size", r.replica_size},
                                 {"replicas", r.replicas},
                                 {"averager_step", r.averager_step},
                                 {"outer", r.outer},
                                 {"outer_steps", r.outer_steps},
                                 {"outer_files", std::move(files)}};
  return checkpoint::seal_json(j, kSealKey);
}

Record parse_record(const std::string& text, const std::string& path) {
  const auto seal = checkpoint::find_seal(text, kSealKey);
  SHARDOPT_CHECK(seal.has_value(), corrupt, "'{}' does not end with its {} member: not a local-SGD record", path,
                 kSealKey);
  const uint32_t crc = checkpoint::seal_of(text, seal->first);
  SHARDOPT_CHECK(crc == seal->second, corrupt,
                 "'{}': its checksum does not match its contents (CRC32C {:08x}, recorded {:08x})", path, crc,
                 seal->second);
  const nlohmann::json json = checkpoint::parse_json_strict(text, path, "local-SGD record");
  const checkpoint::JsonObject top(json, path, "");
  top.only({"format", "version", "generation", "save_id", "world_size", "replica_size", "replicas", "averager_step",
            "outer", "outer_steps", "outer_files", kSealKey});
  SHARDOPT_CHECK(top.string("format") == kFormat, corrupt, "'{}': format is not {}", path, kFormat);
  const int64_t version = top.integer("version", 1, 1 << 30);
  SHARDOPT_CHECK(version == kVersion, unsupported, "'{}': local-SGD record version {} (this build reads {})", path,
                 version, kVersion);
  Record r;
  r.generation = top.unsigned_integer("generation", UINT64_MAX);
  r.save_id = top.string("save_id");
  SHARDOPT_CHECK(!r.save_id.empty() && r.save_id.find_first_of("/\\.") == std::string::npos, corrupt,
                 "'{}': save_id '{}' is not a plain name", path, r.save_id);
  r.world_size = static_cast<int>(top.integer("world_size", 1, INT32_MAX));
  r.replica_size = static_cast<int>(top.integer("replica_size", 1, INT32_MAX));
  r.replicas = static_cast<int>(top.integer("replicas", 1, INT32_MAX));
  SHARDOPT_CHECK(static_cast<int64_t>(r.replica_size) * r.replicas == r.world_size, corrupt,
                 "'{}': {} replicas of {} ranks do not make a world of {}", path, r.replicas, r.replica_size,
                 r.world_size);
  r.averager_step = top.integer("averager_step", 0, INT64_MAX);
  r.outer = top.boolean("outer");
  r.outer_steps = top.integer("outer_steps", 0, INT64_MAX);
  const nlohmann::json& files = top.at("outer_files");
  SHARDOPT_CHECK(files.is_array(), corrupt, "'{}': outer_files is not an array", path);
  SHARDOPT_CHECK(files.size() == (r.outer ? static_cast<std::size_t>(r.replica_size) : 0u), corrupt,
                 "'{}': {} outer_files for {} (outer optimizer {})", path, files.size(), r.replica_size,
                 r.outer ? "on" : "off");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const checkpoint::JsonObject f(files[i], path, fmt::format("outer_files[{}]", i));
    f.only({"name", "bytes", "crc32c"});
    OuterFile file;
    file.name = f.string("name");
    SHARDOPT_CHECK(file.name == outer_file_name(r.save_id, static_cast<int>(i)), corrupt,
                   "'{}': outer_files[{}] is '{}', expected '{}'", path, i, file.name,
                   outer_file_name(r.save_id, static_cast<int>(i)));
    file.bytes = f.integer("bytes", 0, INT64_MAX);
    file.crc32c = static_cast<uint32_t>(f.unsigned_integer("crc32c", UINT32_MAX));
    r.outer_files.push_back(file);
  }
  return r;
}

Record read_record(const std::string& dir) {
  const std::string path = join_path(dir, kRecordName);
  SHARDOPT_CHECK(checkpoint::file_exists(path), io, "load: no local-SGD checkpoint in '{}' ({} is missing)", dir,
                 kRecordName);
  return parse_record(checkpoint::read_whole_file(path), path);
}

}  // namespace

void save_local_sgd(ModelAverager::Impl& av, const std::string& dir) {
  Communicator& world = *av.world;
  optim::AveragingPort& port = av.port;
  // (The gate lets the last step's queued all-gathers land first.)
  comm::AgreementRecord record = port.enter(optim::GateCall::replica_checkpoint, "PostLocalSGDOptimizer::save");
  record.field("averager step", fmt::format("{}", av.step));
  record.validate([&] { SHARDOPT_CHECK(!dir.empty(), invalid_argument, "save: the directory is empty"); });
  comm::agree(world, record);

  // The identity of this save: one past the current record's generation, and a random token.
  Outcome setup;
  std::string save_id;
  if (world.rank() == 0) {
    try {
      checkpoint::make_directories(dir);
      uint64_t generation = 1;
      try {
        generation = read_record(dir).generation + 1;
      } catch (const Error&) {
        // No (readable) previous save: this is the first.
      }
      std::random_device device;
      setup.value0 = generation;
      save_id = local_sgd_save_id(generation, static_cast<uint32_t>(device()));
    } catch (const Error& e) {
      setup.fail(e);
    }
  }
  const uint64_t generation = checkpoint::agree_on_outcomes(world, setup, "save", "preparing the directory")[0].value0;
  save_id = checkpoint::broadcast_string(world, save_id, 0);

  // Every replica its own checkpoint (collective within it; it fails together inside it), and
  // replica 0's ranks the outer state of their shards (value0: its bytes, value1: local rank
  // and CRC32C, for the record).
  Outcome wrote;
  try {
    av.optimizer.save(join_path(dir, replica_dir(save_id, av.groups.replica_index)));
    if (av.config.outer.enabled && av.groups.replica_index == 0) {
      const OuterFile outer = write_outer_file(av.outer, port.params(), port.own_shard(), av.groups.local_rank,
                                               dir, outer_file_name(save_id, av.groups.local_rank));
      wrote.value0 = static_cast<uint64_t>(outer.bytes);
      wrote.value1 = (static_cast<uint64_t>(av.groups.local_rank) << 32) | outer.crc32c;
    }
  } catch (const Error& e) {
    wrote.fail(e);
  }
  const std::vector<Outcome> written = checkpoint::agree_on_outcomes(world, wrote, "save", "writing the replicas");

  Outcome committed;
  if (world.rank() == 0) {
    try {
      Record r;
      r.generation = generation;
      r.save_id = save_id;
      r.world_size = world.size();
      r.replica_size = av.groups.replica_size;
      r.replicas = av.groups.num_replicas;
      r.averager_step = av.step;
      r.outer = av.config.outer.enabled;
      r.outer_steps = av.outer.steps;
      if (r.outer) {
        r.outer_files.resize(static_cast<std::size_t>(r.replica_size));
        for (const Outcome& o : written) {
          if (o.value0 == 0) continue;
          OuterFile& f = r.outer_files.at(static_cast<std::size_t>(o.value1 >> 32));
          f = OuterFile{outer_file_name(save_id, static_cast<int>(o.value1 >> 32)), static_cast<int64_t>(o.value0),
                        static_cast<uint32_t>(o.value1 & 0xffffffffu)};
        }
      }
      checkpoint::fsync_directory(join_path(dir, save_id));
      checkpoint::fsync_directory(dir);
      const std::string text = record_to_json(r);
      const std::string path = join_path(dir, kRecordName);
      checkpoint::AtomicFileWriter file(path);
      file.write(text.data(), text.size());
      file.commit();
      checkpoint::fsync_directory(dir);
      SHARDOPT_CHECK(checkpoint::read_whole_file(path) == text, io, "'{}' reads back other bytes than were written",
                     path);
    } catch (const Error& e) {
      committed.fail(e);
    }
  }
  checkpoint::agree_on_outcomes(world, committed, "save", "committing local_sgd.json");
  // Only now is the previous save unreferenced.
  if (world.rank() == 0) remove_older_saves(dir, save_id);
}

void load_local_sgd(ModelAverager::Impl& av, const std::string& dir) {
  Communicator& world = *av.world;
  optim::AveragingPort& port = av.port;
  // Every rank reads the record itself (a checkpoint lives on a filesystem all ranks share);
  // the ranks agree that they read the same one and that it fits this job before anything.
  Record r;
  comm::AgreementRecord record = port.enter(optim::GateCall::replica_checkpoint, "PostLocalSGDOptimizer::load");
  record.validate([&] {
    r = read_record(dir);
    SHARDOPT_CHECK(r.replicas == av.groups.num_replicas, mismatch,
                   "load: '{}' holds {} replicas, this job has {}", dir, r.replicas, av.groups.num_replicas);
    SHARDOPT_CHECK(!r.outer || r.replica_size == av.groups.replica_size, mismatch,
                   "load: '{}' keeps the outer optimizer's state in shards of replicas of {} ranks, this job's replicas "
                   "have {}",
                   dir, r.replica_size, av.groups.replica_size);
    SHARDOPT_CHECK(r.outer == av.config.outer.enabled, mismatch,
                   "load: '{}' was saved with the outer optimizer {}, this averager has it {}", dir,
                   r.outer ? "on" : "off", av.config.outer.enabled ? "on" : "off");
  });
  record.field("record", fmt::format("save {} at averager step {}", r.save_id, r.averager_step));
  comm::agree(world, record);

  // Every replica's checkpoint verifies before any replica changes, and so does the outer
  // optimizer's state: its files name the parameters and the layout they follow, checked against
  // the replica checkpoint's parameters and trainable flags (those the load installs). The
  // replica's first rank reads every file whole, the others their headers.
  const std::string replica = join_path(dir, replica_dir(r.save_id, av.groups.replica_index));
  SavedOuterState saved;
  Outcome verified;
  try {
    if (port.replica_rank() == 0) verify_checkpoint(replica);
    if (r.outer) {
      saved = read_outer_layout(dir, r.outer_files, checkpoint::read_manifest(replica).params, port.replica_rank() == 0);
    }
  } catch (const Error& e) {
    verified.fail(e);
  }
  checkpoint::agree_on_outcomes(world, verified, "load", "verifying the replicas and the outer optimizer's state");

  Outcome loaded;
  try {
    av.optimizer.load(replica);
  } catch (const Error& e) {
    loaded.fail(e);
  }
  checkpoint::agree_on_outcomes(world, loaded, "load", "loading the replicas");

  // Only now is the layout known (the load may have changed the trainable flags): each element
  // of the outer state goes where this layout keeps that parameter's element, whatever the
  // partition or shard it was saved from.
  OuterState outer;
  Outcome mapped;
  try {
    if (r.outer) map_outer_state(saved, port.params(), port.own_shard(), outer);
  } catch (const Error& e) {
    mapped.fail(e);
  }
  checkpoint::agree_on_outcomes(world, mapped, "load", "placing the outer optimizer's state");
  av.step = r.averager_step;
  if (r.outer) {
    av.outer.anchor = std::move(outer.anchor);
    av.outer.momentum = std::move(outer.momentum);
    av.outer.steps = r.outer_steps;
    av.outer.values_generation = port.values_generation();
    av.outer.provisional = false;
  }
}

}  // namespace averaging
}  // namespace shardopt
