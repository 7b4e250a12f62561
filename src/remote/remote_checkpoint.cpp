// src/remote/remote_checkpoint.cpp — the owners' parameters and state through shardopt's sharded checkpoint: one checkpoint per algorithm, one shard file per owner, loadable onto any owners.
#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/store.hpp"
#include "comm/agreement.hpp"
#include "optim/state_kinds.hpp"
#include "remote/remote_impl.hpp"

namespace shardopt {
namespace {

constexpr std::array<Algorithm, 3> kAlgorithms = {Algorithm::sgd, Algorithm::adam, Algorithm::adamw};

// The directory's parameters of one algorithm, in directory order: a checkpoint's params.
std::vector<int32_t> params_of(const remote::Directory& dir, Algorithm algorithm) {
  std::vector<int32_t> ids;
  for (std::size_t i = 0; i < dir.size(); ++i) {
    if (dir.param(static_cast<int32_t>(i)).algorithm == algorithm) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

// The owners of any of `ids`, ascending: the checkpoint's shard files, in order.
std::vector<int> owners_of(const remote::Directory& dir, const std::vector<int32_t>& ids) {
  std::vector<int> owners;
  for (int32_t id : ids) {
    for (const remote::Slice& s : dir.param(id).slices) owners.push_back(s.owner);
  }
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  return owners;
}

std::vector<optim::StateKind> kinds_needed(Algorithm algorithm, const std::vector<Hyperparams>& groups) {
  const auto needed = optim::state_kinds_needed(std::vector<Algorithm>(groups.size(), algorithm), DType::f32, groups);
  std::vector<optim::StateKind> kinds;
  for (std::size_t k = 0; k < optim::kMaster; ++k) {
    if (needed[k]) kinds.push_back(static_cast<optim::StateKind>(k));
  }
  return kinds;
}

std::vector<float>& state_of(remote::OwnedSlice& s, optim::StateKind kind) {
  switch (kind) {
    case optim::kExpAvg: return s.exp_avg;
    case optim::kExpAvgSq: return s.exp_avg_sq;
    case optim::kMaxExpAvgSq: return s.max_exp_avg_sq;
    default: return s.momentum;
  }
}

// Runs `work`; its Error becomes this rank's failure in an agreement named `operation`, which
// every rank joins (so all raise, or none).
template <typename Work>
void agreed(Communicator& comm, const std::string& operation, Work&& work) {
  comm::AgreementRecord record(operation);
  record.validate(work);
  comm::agree(comm, record);
}

std::string subdir(const std::string& dir, Algorithm algorithm) {
  return checkpoint::join_path(dir, algorithm_name(algorithm));
}

}  // namespace

void RemoteOptimizer::save(const std::string& dir) {
  Impl& im = *impl_;
  Communicator& comm = *im.comm;
  comm::AgreementRecord start("RemoteOptimizer::save");
  start.field("dir", dir);
  start.validate([&] { SHARDOPT_CHECK(!dir.empty(), invalid_argument, "RemoteOptimizer::save: the directory is empty"); });
  comm::agree(comm, start);
  std::unique_lock<std::mutex> lock;
  if (im.service) lock = std::unique_lock<std::mutex>(im.service->store_mutex());
  for (Algorithm algorithm : kAlgorithms) {
    const std::vector<int32_t> ids = params_of(im.directory, algorithm);
    if (ids.empty()) continue;
    const std::string where = subdir(dir, algorithm);
    const std::vector<int> owners = owners_of(im.directory, ids);
    std::vector<Hyperparams> groups;
    for (int32_t id : ids) groups.push_back(im.directory.param(id).hyper);
    const std::vector<optim::StateKind> kinds = kinds_needed(algorithm, groups);
    // Rank 0 names the save; every rank learns it.
    std::array<char, 96> identity{};
    agreed(comm, "RemoteOptimizer::save (naming)", [&] {
      if (comm.rank() != 0) return;
      checkpoint::make_directories(where);
      const auto next = checkpoint::next_save_identity(where);
      std::snprintf(identity.data(), identity.size(), "%llu %s", static_cast<unsigned long long>(next.first),
                    next.second.c_str());
    });
    comm.broadcast(identity.data(), static_cast<int64_t>(identity.size()), DType::byte, 0);
    std::istringstream named(identity.data());
    uint64_t generation = 0;
    std::string save_id;
    named >> generation >> save_id;
    // Each owner writes its shard and describes it (file, segments, steps) for rank 0.
    std::string description;
    const auto mine = std::find(owners.begin(), owners.end(), comm.rank());
    agreed(comm, "RemoteOptimizer::save (shards)", [&] {
      if (mine == owners.end()) return;
      const int index = static_cast<int>(mine - owners.begin());
      const int count = static_cast<int>(owners.size());
      std::vector<remote::OwnedSlice*> slices;
      std::vector<partition::Segment> segments;
      int64_t shard_numel = 0;
      for (std::size_t k = 0; k < ids.size(); ++k) {
        remote::OwnedSlice* s = im.store->slice(ids[k]);
        if (s == nullptr) continue;
        slices.push_back(s);
        segments.push_back({static_cast<int32_t>(k), s->first_element(), shard_numel, s->numel()});
        shard_numel += s->numel();
      }
      std::vector<std::string> kind_names;
      for (optim::StateKind kind : kinds) kind_names.push_back(optim::kStateNames[kind]);
      const std::string name = checkpoint::shard_file_name(save_id, index, count);
      checkpoint::ShardFileWriter writer(checkpoint::join_path(where, name),
                                         checkpoint::shard_tensors(shard_numel, kind_names, 0, index,
                                                                   checkpoint::FileMoments::whole_shard(shard_numel)),
                                         checkpoint::shard_metadata(save_id, index, count));
      for (remote::OwnedSlice* s : slices) writer.write(s->values.data(), s->numel());
      for (optim::StateKind kind : kinds) {
        for (remote::OwnedSlice* s : slices) {
          const std::vector<float>& state = state_of(*s, kind);
          if (state.empty()) {
            writer.write_zeros(s->numel());
          } else {
            writer.write(state.data(), s->numel());
          }
        }
      }
      const checkpoint::ManifestFile file = writer.commit();
      description = fmt::format("{} {} {} {} {}", index, file.bytes, file.crc32c, shard_numel, segments.size());
      for (const auto& g : segments) {
        description += fmt::format(" {} {} {} {}", g.param, g.param_offset, g.shard_offset, g.length);
      }
      for (remote::OwnedSlice* s : slices) {
        const auto k = std::find(ids.begin(), ids.end(), s->param) - ids.begin();
        description += fmt::format(" {} {} {}", k, s->step, int{s->has_momentum_buffer});
      }
    });
    const std::vector<std::string> described = remote::all_gather_text(comm, description);
    agreed(comm, "RemoteOptimizer::save (manifest)", [&] {
      if (comm.rank() != 0) return;
      checkpoint::Manifest m;
      m.generation = generation;
      m.save_id = save_id;
      m.world_size = static_cast<int>(owners.size());
      m.partition = partition::Strategy::sorted_greedy;
      m.alignment = 1;
      m.algorithm = algorithm;
      for (optim::StateKind kind : kinds) m.state_kinds.push_back(optim::kStateNames[kind]);
      m.groups = groups;
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const remote::DirectoryParam& p = im.directory.param(ids[k]);
        checkpoint::ManifestParam mp;
        mp.name = p.name;
        mp.numel = p.rows * p.row_size;
        mp.group = static_cast<int32_t>(k);
        m.params.push_back(mp);
      }
      m.files.resize(owners.size());
      for (const std::string& text : described) {
        if (text.empty()) continue;
        std::istringstream in(text);
        std::size_t index = 0, segments = 0;
        checkpoint::ManifestFile f;
        in >> index >> f.bytes >> f.crc32c >> f.shard_numel >> segments;
        f.name = checkpoint::shard_file_name(save_id, static_cast<int>(index), static_cast<int>(owners.size()));
        f.segments.resize(segments);
        for (auto& g : f.segments) in >> g.param >> g.param_offset >> g.shard_offset >> g.length;
        for (std::size_t j = 0; j < segments; ++j) {
          std::size_t k = 0;
          int momentum = 0;
          in >> k;
          in >> m.params[k].step >> momentum;
          m.params[k].has_momentum_buffer = momentum != 0;
        }
        m.files[index] = f;
      }
      checkpoint::check_manifest(m, checkpoint::join_path(where, checkpoint::kManifestName));
      checkpoint::commit_manifest(where, m);
      checkpoint::remove_unreferenced_files(where, m);
    });
  }
}

void RemoteOptimizer::load(const std::string& dir) {
  Impl& im = *impl_;
  Communicator& comm = *im.comm;
  // Every rank reads the manifests and checks them against the directory before anything changes.
  std::vector<checkpoint::Manifest> manifests(kAlgorithms.size());
  comm::AgreementRecord start("RemoteOptimizer::load");
  start.field("dir", dir);
  start.validate([&] {
    for (std::size_t a = 0; a < kAlgorithms.size(); ++a) {
      const std::vector<int32_t> ids = params_of(im.directory, kAlgorithms[a]);
      const std::string where = subdir(dir, kAlgorithms[a]);
      if (ids.empty()) {
        SHARDOPT_CHECK(!checkpoint::file_exists(checkpoint::join_path(where, checkpoint::kManifestName)),
                       invalid_argument, "RemoteOptimizer::load: '{}' holds {} parameters, but none is registered",
                       dir, algorithm_name(kAlgorithms[a]));
        continue;
      }
      manifests[a] = checkpoint::read_manifest(where);
      const checkpoint::Manifest& m = manifests[a];
      SHARDOPT_CHECK(m.algorithm == kAlgorithms[a] && m.params.size() == ids.size(), invalid_argument,
                     "RemoteOptimizer::load: '{}' holds {} {} parameters, {} are registered", where, m.params.size(),
                     algorithm_name(m.algorithm), ids.size());
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const remote::DirectoryParam& p = im.directory.param(ids[k]);
        SHARDOPT_CHECK(m.params[k].name == p.name && m.params[k].numel == p.rows * p.row_size, invalid_argument,
                       "RemoteOptimizer::load: '{}' holds '{}' of {} elements where '{}' of {} is registered", where,
                       m.params[k].name, m.params[k].numel, p.name, p.rows * p.row_size);
      }
    }
  });
  comm::agree(comm, start);
  // Owners read their rows into new buffers; installed only once every rank succeeded.
  std::vector<remote::OwnedSlice> loaded;
  agreed(comm, "RemoteOptimizer::load (shards)", [&] {
    if (!im.store) return;
    for (std::size_t a = 0; a < kAlgorithms.size(); ++a) {
      const std::vector<int32_t> ids = params_of(im.directory, kAlgorithms[a]);
      if (ids.empty()) continue;
      checkpoint::CheckpointReader reader(subdir(dir, kAlgorithms[a]), manifests[a]);
      for (std::size_t f = 0; f < manifests[a].files.size(); ++f) {
        reader.check_present(f);
        reader.check_header(f);
        reader.verify_checksum(f);
      }
      const std::vector<optim::StateKind> kinds = kinds_needed(kAlgorithms[a], manifests[a].groups);
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const remote::OwnedSlice* now = im.store->slice(ids[k]);
        if (now == nullptr) continue;
        remote::OwnedSlice s = *now;
        const checkpoint::ManifestParam& mp = manifests[a].params[k];
        s.step = mp.step;
        s.has_momentum_buffer = mp.has_momentum_buffer;
        const auto n = static_cast<std::size_t>(s.numel());
        reader.read_param_range(checkpoint::kParamsTensor, static_cast<int32_t>(k), s.first_element(), s.numel(),
                                s.values.data());
        for (optim::StateKind kind : {optim::kExpAvg, optim::kExpAvgSq, optim::kMaxExpAvgSq, optim::kMomentum}) {
          std::vector<float>& state = state_of(s, kind);
          state.clear();
          if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
          state.assign(n, 0.f);
          reader.read_param_range(optim::kStateNames[kind], static_cast<int32_t>(k), s.first_element(), s.numel(),
                                  state.data());
        }
        loaded.push_back(std::move(s));
      }
      reader.flush();
    }
  });
  std::unique_lock<std::mutex> lock;
  if (im.service) lock = std::unique_lock<std::mutex>(im.service->store_mutex());
  for (remote::OwnedSlice& s : loaded) *im.store->slice(s.param) = std::move(s);
  if (lock.owns_lock()) lock.unlock();
  // No trainer may step before every owner has installed what it loaded.
  comm.barrier();
}

}  // namespace shardopt
