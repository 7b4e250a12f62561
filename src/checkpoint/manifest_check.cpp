// src/checkpoint/manifest_check.cpp — the consistency a manifest must have on its own before a load may trust it.
#include <algorithm>
#include <array>
#include <cmath>

#include "checkpoint/checked_int.hpp"
#include "checkpoint/manifest.hpp"
#include "core/check.hpp"
#include "q8_state.hpp"
#include "optim/hyperparams.hpp"
#include "optim/state_kinds.hpp"

namespace shardopt {
namespace checkpoint {
namespace {


// Save ids become part of file names: letters, digits and '-' only, so that no manifest can
// point outside its directory.
bool plain_save_id(const std::string& id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

void check_params_and_groups(const Manifest& m, const std::string& path) {
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    // The checks a step makes: a checkpoint a step would refuse does not verify either.
    try {
      optim::validate_hyperparams(m.groups[g], group_algorithm(m, g), static_cast<int>(g));
    } catch (const Error& e) {
      raise(ErrorCode::corrupt, "'{}': groups[{}] holds hyperparameters no optimizer accepts: {}", path, g, e.what());
    }
  }
  int64_t total = 0;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ManifestParam& p = m.params[i];
    SHARDOPT_CHECK(p.numel >= 0 && p.numel <= kMaxElements && p.step >= 0, corrupt,
                   "'{}': params[{}] '{}' has numel {} and step {}", path, i, p.name, p.numel, p.step);
    SHARDOPT_CHECK(p.group >= 0 && static_cast<std::size_t>(p.group) < m.groups.size(), corrupt,
                   "'{}': params[{}] '{}' is in group {} but there are {} groups", path, i, p.name, p.group,
                   m.groups.size());
    // An optimizer's parameters share one dtype (ParamTable), so its checkpoint's do too.
    SHARDOPT_CHECK(p.dtype == m.params[0].dtype, corrupt, "'{}': params[{}] '{}' is {} but params[0] is {}", path, i,
                   p.name, dtype_name(p.dtype), dtype_name(m.params[0].dtype));
    if (group_algorithm(m, static_cast<std::size_t>(p.group)) == Algorithm::muon) {
      // Without multiplying: the dimensions come from the file and may be huge.
      const bool matrix = p.shape.size() == 2 && (p.shape[0] == 0 ? p.numel == 0 && p.shape[1] >= 0
                                                                   : p.numel % p.shape[0] == 0 &&
                                                                         p.numel / p.shape[0] == p.shape[1]);
      SHARDOPT_CHECK(matrix, corrupt,
                     "'{}': params[{}] '{}' is in a Muon group but has no 2-D shape of {} elements", path, i, p.name,
                     p.numel);
    }
    if (p.q8) {
      // What a q8 save writes (ParamTable::q8_moments): trainable Adam/AdamW params, whole.
      const Algorithm algorithm = group_algorithm(m, static_cast<std::size_t>(p.group));
      SHARDOPT_CHECK(p.trainable && (algorithm == Algorithm::adam || algorithm == Algorithm::adamw) &&
                         p.numel >= kernels::kQ8MinNumel,
                     corrupt,
                     "'{}': params[{}] '{}' says state_precision q8, but 8-bit moments are kept only by trainable "
                     "Adam/AdamW params of at least {} elements (it is {}, {}, {} elements)",
                     path, i, p.name, kernels::kQ8MinNumel, p.trainable ? "trainable" : "frozen",
                     algorithm_name(algorithm), p.numel);
    }
    SHARDOPT_CHECK(checked_add(total, p.numel, &total) && total <= kMaxElements, corrupt,
                   "'{}': the parameters hold more than {} elements in all", path, kMaxElements);
  }
}

// The kinds must be known, in canonical order, ones the algorithm keeps, and every one its
// groups and dtype need: a manifest that lists fewer would load with state silently zeroed.
void check_state_kinds(const Manifest& m, const std::string& path) {
  const DType dtype = m.params.empty() ? DType::f32 : m.params[0].dtype;
  std::vector<Algorithm> algorithms;
  for (std::size_t g = 0; g < m.groups.size(); ++g) algorithms.push_back(group_algorithm(m, g));
  const auto needed = optim::state_kinds_needed(algorithms, dtype, m.groups);
  // The kinds some group's algorithm keeps (whatever its hyperparameters now say).
  bool keeps_momentum = false;
  bool keeps_moments = false;
  for (Algorithm a : algorithms) {
    keeps_momentum = keeps_momentum || a == Algorithm::sgd || a == Algorithm::muon;
    keeps_moments = keeps_moments || a == Algorithm::adam || a == Algorithm::adamw;
  }
  std::array<bool, optim::kStateKinds> listed{};
  int previous = -1;
  for (const std::string& name : m.state_kinds) {
    const std::size_t kind = optim::state_kind_index(name);
    const int k = static_cast<int>(kind);
    SHARDOPT_CHECK(kind < optim::kStateKinds, corrupt, "'{}': state_kinds holds '{}', not a state kind", path, name);
    SHARDOPT_CHECK(k > previous, corrupt, "'{}': state_kinds lists '{}' twice or out of order", path, name);
    previous = k;
    const bool sgd_kind = k == optim::kMomentum;
    const bool adam_kind = k == optim::kExpAvg || k == optim::kExpAvgSq || k == optim::kMaxExpAvgSq;
    const bool allowed = k == optim::kMaster ? dtype != DType::f32 : (sgd_kind ? keeps_momentum : adam_kind && keeps_moments);
    SHARDOPT_CHECK(allowed, corrupt, "'{}': state_kinds holds '{}', which a {} optimizer over {} parameters does not keep",
                   path, name, algorithm_name(m.algorithm), dtype_name(dtype));
    listed[static_cast<std::size_t>(k)] = true;
  }
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    SHARDOPT_CHECK(!needed[k] || listed[k], corrupt,
                   "'{}': state_kinds lacks '{}', which this {} optimizer's groups need (its state would load as zeros)",
                   path, optim::kStateNames[k], algorithm_name(m.algorithm));
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    SHARDOPT_CHECK(!m.params[i].has_momentum_buffer || listed[optim::kMomentum], corrupt,
                   "'{}': params[{}] '{}' has a momentum buffer but state_kinds lacks 'momentum_buffer'", path, i,
                   m.params[i].name);
  }
}

// Each file named as this save names it; segments inside their parameter and shard, disjoint
// within the shard, and together covering every trainable parameter exactly once.
void check_files_and_segments(const Manifest& m, const std::string& path) {
  const std::size_t expected_files =
      m.partition == partition::Strategy::replicated ? 1 : static_cast<std::size_t>(m.world_size);
  SHARDOPT_CHECK(m.files.size() == expected_files, corrupt, "'{}': {} shard files listed, expected {} (world_size {}, {})",
                 path, m.files.size(), expected_files, m.world_size, strategy_name(m.partition));
  int64_t total_bytes = 0;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces(m.params.size());
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const ManifestFile& f = m.files[i];
    const std::string expected = shard_file_name(m.save_id, static_cast<int>(i), static_cast<int>(m.files.size()));
    SHARDOPT_CHECK(f.name == expected, corrupt, "'{}': files[{}] is named '{}'; this save names it '{}'", path, i, f.name,
                   expected);
    SHARDOPT_CHECK(f.shard_numel >= 0 && f.shard_numel <= kMaxElements && f.bytes >= 0, corrupt,
                   "'{}': files[{}] has shard_numel {} and bytes {}", path, i, f.shard_numel, f.bytes);
    SHARDOPT_CHECK(checked_add(total_bytes, f.bytes, &total_bytes), corrupt, "'{}': the shard files' bytes overflow", path);
    std::vector<std::pair<int64_t, int64_t>> used;  // [shard_offset, end) of this file's segments
    for (std::size_t k = 0; k < f.segments.size(); ++k) {
      const partition::Segment& s = f.segments[k];
      SHARDOPT_CHECK(s.param >= 0 && static_cast<std::size_t>(s.param) < m.params.size(), corrupt,
                     "'{}': files[{}].segments[{}] is of parameter #{} (there are {})", path, i, k, s.param,
                     m.params.size());
      const ManifestParam& p = m.params[static_cast<std::size_t>(s.param)];
      // Every term is within [0, kMaxElements], so these sums cannot overflow.
      const bool inside = s.length >= 0 && s.param_offset >= 0 && s.shard_offset >= 0 && s.length <= kMaxElements &&
                          s.param_offset <= kMaxElements && s.shard_offset <= kMaxElements &&
                          s.param_offset + s.length <= p.numel && s.shard_offset + s.length <= f.shard_numel;
      SHARDOPT_CHECK(inside, corrupt,
                     "'{}': files[{}].segments[{}] (param_offset {}, shard_offset {}, length {}) lies outside '{}' ({} "
                     "elements) or the shard ({} elements)",
                     path, i, k, s.param_offset, s.shard_offset, s.length, p.name, p.numel, f.shard_numel);
      SHARDOPT_CHECK(p.trainable || s.length == 0, corrupt, "'{}': frozen parameter '{}' has a segment in files[{}]", path,
                     p.name, i);
      if (s.length == 0) continue;
      pieces[static_cast<std::size_t>(s.param)].emplace_back(s.param_offset, s.length);
      used.emplace_back(s.shard_offset, s.shard_offset + s.length);
    }
    std::sort(used.begin(), used.end());
    for (std::size_t k = 1; k < used.size(); ++k) {
      SHARDOPT_CHECK(used[k].first >= used[k - 1].second, corrupt,
                     "'{}': two segments of files[{}] overlap at shard element {} (two parameters would read the same "
                     "bytes)",
                     path, i, used[k].first);
    }
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (!m.params[i].trainable) continue;
    auto& list = pieces[i];
    std::sort(list.begin(), list.end());
    int64_t next = 0;
    for (const auto& [offset, length] : list) {
      SHARDOPT_CHECK(offset == next, corrupt, "'{}': the segments of '{}' {} at element {}", path, m.params[i].name,
                     offset < next ? "overlap" : "leave a hole", std::min(offset, next));
      next += length;
    }
    SHARDOPT_CHECK(next == m.params[i].numel, corrupt, "'{}': the segments of '{}' cover {} of its {} elements", path,
                   m.params[i].name, next, m.params[i].numel);
    // 8-bit blocks are cut per parameter from its first element: a save never splits one.
    SHARDOPT_CHECK(!m.params[i].q8 || list.size() == 1, corrupt,
                   "'{}': '{}' keeps 8-bit moments but lies in {} segments (a save keeps such a parameter whole)",
                   path, m.params[i].name, list.size());
  }
}

// The alignment a layout of this partition has: a power of two under flat (every shard then
// holds a whole number of aligned blocks, all shards alike), 1 otherwise (unpadded shards).
void check_alignment(const Manifest& m, const std::string& path) {
  const int64_t a = m.alignment;
  SHARDOPT_CHECK(a >= 1 && a <= kMaxAlignment && (a & (a - 1)) == 0, corrupt,
                 "'{}': alignment {} is not a power of two in [1, {}]", path, a, kMaxAlignment);
  if (m.partition != partition::Strategy::flat) {
    SHARDOPT_CHECK(a == 1, corrupt, "'{}': alignment is {}, but a {} layout is unpadded (alignment 1)", path, a,
                   strategy_name(m.partition));
    return;
  }
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const int64_t n = m.files[i].shard_numel;
    SHARDOPT_CHECK(n % a == 0 && n == m.files[0].shard_numel, corrupt,
                   "'{}': files[{}] has shard_numel {}, but flat shards all hold the same multiple of the alignment {} "
                   "(files[0] has {})",
                   path, i, n, a, m.files[0].shard_numel);
  }
}

}  // namespace

void check_manifest(const Manifest& m, const std::string& path) {
  SHARDOPT_CHECK(m.world_size >= 1 && m.world_size <= kMaxWorldSize, corrupt, "'{}': world_size {} is out of range", path,
                 m.world_size);
  check_alignment(m, path);
  SHARDOPT_CHECK(plain_save_id(m.save_id), corrupt, "'{}': save_id '{}' is not a plain identifier", path, m.save_id);
  SHARDOPT_CHECK(!m.has_loss_scale || (std::isfinite(m.loss_scale) && m.loss_scale > 0 && m.growth_tracker >= 0), corrupt,
                 "'{}': loss_scaling holds scale {} and growth_tracker {}", path, m.loss_scale, m.growth_tracker);
  check_params_and_groups(m, path);
  check_state_kinds(m, path);
  check_files_and_segments(m, path);
}

}  // namespace checkpoint
}  // namespace shardopt
