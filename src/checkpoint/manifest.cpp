// src/checkpoint/manifest.cpp — manifest.json encoding, parsing and consistency checks.
#include "checkpoint/manifest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "checkpoint/file_io.hpp"
#include "core/check.hpp"
#include "optim/state_kinds.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kFormatName = "shardopt-checkpoint";

ojson hyper_to_json(const Hyperparams& h) {
  return ojson{{"lr", h.lr},
               {"beta1", h.beta1},
               {"beta2", h.beta2},
               {"eps", h.eps},
               {"weight_decay", h.weight_decay},
               {"momentum", h.momentum},
               {"dampening", h.dampening},
               {"nesterov", h.nesterov},
               {"maximize", h.maximize},
               {"amsgrad", h.amsgrad}};
}

Hyperparams hyper_from_json(const nlohmann::json& j) {
  Hyperparams h;
  h.lr = j.at("lr").get<double>();
  h.beta1 = j.at("beta1").get<double>();
  h.beta2 = j.at("beta2").get<double>();
  h.eps = j.at("eps").get<double>();
  h.weight_decay = j.at("weight_decay").get<double>();
  h.momentum = j.at("momentum").get<double>();
  h.dampening = j.at("dampening").get<double>();
  h.nesterov = j.at("nesterov").get<bool>();
  h.maximize = j.at("maximize").get<bool>();
  h.amsgrad = j.at("amsgrad").get<bool>();
  return h;
}

DType dtype_from_name(const std::string& name, const std::string& path) {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    if (name == dtype_name(d)) return d;
  }
  raise(ErrorCode::corrupt, "'{}': unknown dtype '{}'", path, name);
}

partition::Strategy strategy_from_name(const std::string& name, const std::string& path) {
  for (auto s : {partition::Strategy::flat, partition::Strategy::sorted_greedy, partition::Strategy::replicated}) {
    if (name == strategy_name(s)) return s;
  }
  raise(ErrorCode::corrupt, "'{}': unknown partition '{}'", path, name);
}

Algorithm algorithm_from_name(const std::string& name, const std::string& path) {
  for (Algorithm a : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
    if (name == algorithm_name(a)) return a;
  }
  raise(ErrorCode::corrupt, "'{}': unknown algorithm '{}'", path, name);
}

// Every trainable param must be covered exactly once by the segments of all files, and
// frozen params not at all: otherwise a load would leave holes or read garbage.
void check_consistency(const Manifest& m, const std::string& path) {
  SHARDOPT_CHECK(m.world_size >= 1, corrupt, "'{}': world_size {} is not positive", path, m.world_size);
  const std::size_t expected_files =
      m.partition == partition::Strategy::replicated ? 1 : static_cast<std::size_t>(m.world_size);
  SHARDOPT_CHECK(m.files.size() == expected_files, corrupt, "'{}': {} shard files listed, expected {}", path,
                 m.files.size(), expected_files);
  for (const std::string& kind : m.state_kinds) {
    SHARDOPT_CHECK(std::find(std::begin(optim::kStateNames), std::end(optim::kStateNames), kind) != std::end(optim::kStateNames),
                   corrupt, "'{}': unknown state kind '{}'", path, kind);
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const ManifestParam& p = m.params[i];
    SHARDOPT_CHECK(p.numel >= 0 && p.step >= 0, corrupt, "'{}': parameter '{}' has a negative numel or step", path, p.name);
    SHARDOPT_CHECK(p.group >= 0 && static_cast<std::size_t>(p.group) < m.groups.size(), corrupt,
                   "'{}': parameter '{}' is in group {} but there are {} groups", path, p.name, p.group, m.groups.size());
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces(m.params.size());
  for (const ManifestFile& f : m.files) {
    SHARDOPT_CHECK(f.shard_numel >= 0 && f.bytes >= 0, corrupt, "'{}': file '{}' has a negative size", path, f.name);
    SHARDOPT_CHECK(f.name.find('/') == std::string::npos && !f.name.empty() && f.name[0] != '.', corrupt,
                   "'{}': shard file name '{}' is not a plain file name", path, f.name);
    for (const partition::Segment& s : f.segments) {
      SHARDOPT_CHECK(s.param >= 0 && static_cast<std::size_t>(s.param) < m.params.size(), corrupt,
                     "'{}': file '{}' has a segment of parameter #{} (there are {})", path, f.name, s.param, m.params.size());
      const ManifestParam& p = m.params[static_cast<std::size_t>(s.param)];
      SHARDOPT_CHECK(s.length >= 0 && s.param_offset >= 0 && s.shard_offset >= 0 &&
                         s.param_offset + s.length <= p.numel && s.shard_offset + s.length <= f.shard_numel,
                     corrupt, "'{}': file '{}' has a segment of '{}' outside the parameter or the shard", path, f.name, p.name);
      SHARDOPT_CHECK(p.trainable || s.length == 0, corrupt, "'{}': frozen parameter '{}' has a segment in '{}'", path,
                     p.name, f.name);
      if (s.length > 0) pieces[static_cast<std::size_t>(s.param)].emplace_back(s.param_offset, s.length);
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
  }
}

}  // namespace

int64_t Manifest::frozen_numel() const {
  int64_t n = 0;
  for (const ManifestParam& p : params) n += p.trainable ? 0 : p.numel;
  return n;
}

int64_t Manifest::total_file_bytes() const {
  int64_t n = 0;
  for (const ManifestFile& f : files) n += f.bytes;
  return n;
}

const char* strategy_name(partition::Strategy strategy) {
  switch (strategy) {
    case partition::Strategy::flat: return "flat";
    case partition::Strategy::sorted_greedy: return "sorted_greedy";
    case partition::Strategy::replicated: return "replicated";
  }
  return "unknown";
}

std::string manifest_to_json(const Manifest& m) {
  ojson j;
  j["format"] = kFormatName;
  j["format_version"] = m.format_version;
  j["generation"] = m.generation;
  j["save_id"] = m.save_id;
  j["world_size"] = m.world_size;
  j["partition"] = strategy_name(m.partition);
  j["alignment"] = m.alignment;
  j["algorithm"] = algorithm_name(m.algorithm);
  j["state_kinds"] = m.state_kinds;
  if (m.has_loss_scale) j["loss_scaling"] = ojson{{"scale", m.loss_scale}, {"growth_tracker", m.growth_tracker}};
  j["groups"] = ojson::array();
  for (const Hyperparams& h : m.groups) j["groups"].push_back(hyper_to_json(h));
  j["params"] = ojson::array();
  for (const ManifestParam& p : m.params) {
    j["params"].push_back(ojson{{"name", p.name},
                                {"numel", p.numel},
                                {"dtype", dtype_name(p.dtype)},
                                {"group", p.group},
                                {"trainable", p.trainable},
                                {"step", p.step},
                                {"has_momentum_buffer", p.has_momentum_buffer}});
  }
  j["files"] = ojson::array();
  for (const ManifestFile& f : m.files) {
    ojson segments = ojson::array();
    for (const partition::Segment& s : f.segments) {
      segments.push_back(ojson::array({s.param, s.param_offset, s.shard_offset, s.length}));
    }
    j["files"].push_back(ojson{{"name", f.name},
                               {"bytes", f.bytes},
                               {"crc32c", f.crc32c},
                               {"shard_numel", f.shard_numel},
                               {"segments", std::move(segments)}});
  }
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}' is not valid JSON ({})", path, e.what());
  }
  Manifest m;
  try {
    SHARDOPT_CHECK(j.is_object() && j.value("format", std::string()) == kFormatName, corrupt,
                   "'{}' is not a shardopt checkpoint manifest (no \"format\": \"{}\")", path, kFormatName);
    m.format_version = j.at("format_version").get<int>();
    SHARDOPT_CHECK(m.format_version <= kFormatVersion, unsupported,
                   "'{}' has format version {}, newer than this shardopt reads (up to {}): upgrade shardopt", path,
                   m.format_version, kFormatVersion);
    SHARDOPT_CHECK(m.format_version >= 1, corrupt, "'{}' has invalid format version {}", path, m.format_version);
    m.generation = j.at("generation").get<uint64_t>();
    m.save_id = j.at("save_id").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.partition = strategy_from_name(j.at("partition").get<std::string>(), path);
    m.alignment = j.at("alignment").get<int64_t>();
    m.algorithm = algorithm_from_name(j.at("algorithm").get<std::string>(), path);
    m.state_kinds = j.at("state_kinds").get<std::vector<std::string>>();
    if (j.contains("loss_scaling")) {
      m.has_loss_scale = true;
      m.loss_scale = j.at("loss_scaling").at("scale").get<double>();
      m.growth_tracker = j.at("loss_scaling").at("growth_tracker").get<int64_t>();
      SHARDOPT_CHECK(std::isfinite(m.loss_scale) && m.loss_scale > 0 && m.growth_tracker >= 0, corrupt,
                     "'{}': loss_scaling holds scale {} and growth_tracker {}", path, m.loss_scale, m.growth_tracker);
    }
    for (const auto& g : j.at("groups")) m.groups.push_back(hyper_from_json(g));
    for (const auto& p : j.at("params")) {
      ManifestParam r;
      r.name = p.at("name").get<std::string>();
      r.numel = p.at("numel").get<int64_t>();
      r.dtype = dtype_from_name(p.at("dtype").get<std::string>(), path);
      r.group = p.at("group").get<int32_t>();
      r.trainable = p.at("trainable").get<bool>();
      r.step = p.at("step").get<int64_t>();
      r.has_momentum_buffer = p.at("has_momentum_buffer").get<bool>();
      m.params.push_back(std::move(r));
    }
    for (const auto& f : j.at("files")) {
      ManifestFile r;
      r.name = f.at("name").get<std::string>();
      r.bytes = f.at("bytes").get<int64_t>();
      r.crc32c = f.at("crc32c").get<uint32_t>();
      r.shard_numel = f.at("shard_numel").get<int64_t>();
      for (const auto& s : f.at("segments")) {
        const auto v = s.get<std::vector<int64_t>>();
        SHARDOPT_CHECK(v.size() == 4, corrupt, "'{}': a segment of '{}' needs 4 numbers", path, r.name);
        SHARDOPT_CHECK(v[0] >= 0 && v[0] <= INT32_MAX, corrupt, "'{}': segment parameter index {} out of range", path, v[0]);
        r.segments.push_back(partition::Segment{static_cast<int32_t>(v[0]), v[1], v[2], v[3]});
      }
      m.files.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}' is malformed: {}", path, e.what());
  }
  check_consistency(m, path);
  return m;
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = join_path(dir, kManifestName);
  SHARDOPT_CHECK(file_exists(path), io, "no checkpoint in '{}': '{}' is missing", dir, path);
  return parse_manifest(read_whole_file(path), path);
}

std::string params_summary_json(const Manifest& m) {
  ojson j = ojson::array();
  for (const ManifestParam& p : m.params) {
    j.push_back(ojson{{"name", p.name},
                      {"numel", p.numel},
                      {"dtype", dtype_name(p.dtype)},
                      {"group", p.group},
                      {"trainable", p.trainable},
                      {"step", p.step},
                      {"has_momentum_buffer", p.has_momentum_buffer}});
  }
  return j.dump();
}

std::string groups_summary_json(const Manifest& m) {
  ojson j = ojson::array();
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    ojson group = hyper_to_json(m.groups[g]);
    std::vector<int64_t> members;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      if (static_cast<std::size_t>(m.params[i].group) == g) members.push_back(static_cast<int64_t>(i));
    }
    group["params"] = members;
    j.push_back(std::move(group));
  }
  return j.dump();
}

std::string shard_file_name(const std::string& save_id, int index, int count) {
  return fmt::format("shard-{}-{:05d}-of-{:05d}.safetensors", save_id, index, count);
}

bool is_checkpoint_file_name(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  auto ends = [&](const char* s) {
    const std::size_t n = std::char_traits<char>::length(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return (starts("shard-") && ends(".safetensors")) || (starts(".shard-") && ends(".safetensors.tmp")) ||
         name == std::string(".") + kManifestName + ".tmp";
}

}  // namespace checkpoint
}  // namespace shardopt
