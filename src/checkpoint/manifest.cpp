// src/checkpoint/manifest.cpp — manifest.json: encoding with its own checksum, and strict parsing.
#include "checkpoint/manifest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "checkpoint/checked_int.hpp"
#include "checkpoint/file_io.hpp"
#include "checkpoint/json_reader.hpp"
#include "checkpoint/sealed_json.hpp"
#include "core/check.hpp"
#include "optim/param_table.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kFormatName = "shardopt-checkpoint";
// The manifest's own checksum, sealed_json.hpp's last member.
constexpr const char* kChecksumKey = "manifest_crc32c";
// No real manifest comes near this (a million parameters take ~200 MB); a larger file is
// refused before it is read into memory.
constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;

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

Algorithm algorithm_from_name(const std::string& name, const std::string& path);

// A group: its hyperparameters, its algorithm where it is not the optimizer's, and Muon's own
// hyperparameters for a Muon group (so checkpoints without Muon keep their bytes).
ojson group_to_json(const Hyperparams& h, Algorithm algorithm, Algorithm optimizer_algorithm) {
  ojson j = hyper_to_json(h);
  if (algorithm != optimizer_algorithm) j["algorithm"] = algorithm_name(algorithm);
  if (algorithm == Algorithm::muon) {
    j["ns_coefficients"] = ojson::array({h.ns_coefficients[0], h.ns_coefficients[1], h.ns_coefficients[2]});
    j["ns_steps"] = h.ns_steps;
    j["adjust_lr_fn"] = muon_lr_adjust_name(h.adjust_lr_fn);
  }
  return j;
}

Hyperparams hyper_from_json(const JsonObject& j, Algorithm optimizer_algorithm, Algorithm& algorithm) {
  j.only({"lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "nesterov", "maximize", "amsgrad",
          "algorithm", "ns_coefficients", "ns_steps", "adjust_lr_fn"});
  algorithm = j.has("algorithm") ? algorithm_from_name(j.string("algorithm"), j.path()) : optimizer_algorithm;
  Hyperparams h;
  if (algorithm == Algorithm::muon) {
    const nlohmann::json& ns = j.at("ns_coefficients");
    SHARDOPT_CHECK(ns.is_array() && ns.size() == 3 && ns[0].is_number() && ns[1].is_number() && ns[2].is_number(),
                   corrupt, "'{}': {} is {}, not three numbers", j.path(), j.name("ns_coefficients"), json_excerpt(ns));
    for (std::size_t i = 0; i < 3; ++i) h.ns_coefficients[i] = ns[i].get<double>();
    h.ns_steps = static_cast<int32_t>(j.integer("ns_steps", 0, 99));
    const std::string adjust = j.string("adjust_lr_fn");
    bool known = false;
    for (MuonLrAdjust a : {MuonLrAdjust::none, MuonLrAdjust::original, MuonLrAdjust::match_rms_adamw,
                           MuonLrAdjust::spectral_unclamped}) {
      if (adjust == muon_lr_adjust_name(a)) {
        h.adjust_lr_fn = a;
        known = true;
      }
    }
    SHARDOPT_CHECK(known, corrupt, "'{}': {} is '{}', not an adjust_lr_fn", j.path(), j.name("adjust_lr_fn"), adjust);
  }
  h.lr = j.number("lr");
  h.beta1 = j.number("beta1");
  h.beta2 = j.number("beta2");
  h.eps = j.number("eps");
  h.weight_decay = j.number("weight_decay");
  h.momentum = j.number("momentum");
  h.dampening = j.number("dampening");
  h.nesterov = j.boolean("nesterov");
  h.maximize = j.boolean("maximize");
  h.amsgrad = j.boolean("amsgrad");
  return h;
}

DType dtype_from_name(const std::string& name, const std::string& path, const std::string& field) {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    if (name == dtype_name(d)) return d;
  }
  raise(ErrorCode::corrupt, "'{}': {} is '{}', not a dtype", path, field, name);
}

partition::Strategy strategy_from_name(const std::string& name, const std::string& path) {
  for (auto s : {partition::Strategy::flat, partition::Strategy::sorted_greedy, partition::Strategy::replicated}) {
    if (name == strategy_name(s)) return s;
  }
  raise(ErrorCode::corrupt, "'{}': unknown partition '{}'", path, name);
}

Algorithm algorithm_from_name(const std::string& name, const std::string& path) {
  for (Algorithm a : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw, Algorithm::muon}) {
    if (name == algorithm_name(a)) return a;
  }
  raise(ErrorCode::corrupt, "'{}': unknown algorithm '{}'", path, name);
}

const nlohmann::json& array_at(const JsonObject& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  SHARDOPT_CHECK(v.is_array(), corrupt, "'{}': {} is {}, not a list", j.path(), j.name(key), json_excerpt(v));
  return v;
}

Manifest manifest_from_json(const nlohmann::json& json, const std::string& path, int version) {
  const JsonObject j(json, path, "");
  if (version >= 2) {
    j.only({"format", "format_version", "generation", "save_id", "world_size", "partition", "alignment", "algorithm",
            "state_kinds", "loss_scaling", "moment_placement", "groups", "params", "files", "manifest_crc32c"});
  }
  Manifest m;
  m.format_version = version;
  m.generation = j.unsigned_integer("generation", UINT64_MAX);
  m.save_id = j.string("save_id");
  m.world_size = static_cast<int>(j.integer("world_size", 1, kMaxWorldSize));
  m.partition = strategy_from_name(j.string("partition"), path);
  m.alignment = j.integer("alignment", 1, kMaxAlignment);
  m.algorithm = algorithm_from_name(j.string("algorithm"), path);
  const nlohmann::json& kinds = array_at(j, "state_kinds");
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    SHARDOPT_CHECK(kinds[k].is_string(), corrupt, "'{}': state_kinds[{}] is {}, not a string", path, k,
                   json_excerpt(kinds[k]));
    m.state_kinds.push_back(kinds[k].get<std::string>());
  }
  if (j.has("loss_scaling")) {
    const JsonObject scaling(j.at("loss_scaling"), path, "loss_scaling");
    scaling.only({"scale", "growth_tracker"});
    m.has_loss_scale = true;
    m.loss_scale = scaling.number("scale");
    m.growth_tracker = scaling.integer("growth_tracker", 0, INT64_MAX);
  }
  if (j.has("moment_placement")) {
    const std::string placement = j.string("moment_placement");
    SHARDOPT_CHECK(placement == "by_algorithm", corrupt, "'{}': moment_placement is '{}'; a manifest names only \"by_algorithm\" there",
                   path, placement);
    m.moments_by_algorithm = true;
  }
  const nlohmann::json& groups = array_at(j, "groups");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    Algorithm algorithm = m.algorithm;
    m.groups.push_back(hyper_from_json(JsonObject(groups[g], path, fmt::format("groups[{}]", g)), m.algorithm, algorithm));
    m.group_algorithms.push_back(algorithm);
  }
  const nlohmann::json& params = array_at(j, "params");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const JsonObject p(params[i], path, fmt::format("params[{}]", i));
    p.only({"name", "numel", "dtype", "group", "shape", "trainable", "step", "has_momentum_buffer", "state_precision"});
    ManifestParam r;
    r.name = p.string("name");
    r.numel = p.integer("numel", 0, kMaxElements);
    r.dtype = dtype_from_name(p.string("dtype"), path, p.name("dtype"));
    r.group = static_cast<int32_t>(p.integer("group", 0, INT32_MAX));
    if (p.has("shape")) {
      const nlohmann::json& shape = array_at(p, "shape");
      for (std::size_t d = 0; d < shape.size(); ++d) {
        r.shape.push_back(json_integer(shape[d], 0, kMaxElements, path, fmt::format("params[{}].shape[{}]", i, d)));
      }
    }
    r.trainable = p.boolean("trainable");
    r.step = p.integer("step", 0, INT64_MAX);
    r.has_momentum_buffer = p.boolean("has_momentum_buffer");
    if (p.has("state_precision")) {
      const std::string precision = p.string("state_precision");
      SHARDOPT_CHECK(precision == "q8", corrupt, "'{}': {} is '{}'; a manifest names only \"q8\" there", path,
                     p.name("state_precision"), precision);
      r.q8 = true;
    }
    m.params.push_back(std::move(r));
  }
  const nlohmann::json& files = array_at(j, "files");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const JsonObject f(files[i], path, fmt::format("files[{}]", i));
    f.only({"name", "bytes", "crc32c", "shard_numel", "segments"});
    ManifestFile r;
    r.name = f.string("name");
    r.bytes = f.integer("bytes", 0, INT64_MAX);
    r.crc32c = static_cast<uint32_t>(f.unsigned_integer("crc32c", UINT32_MAX));
    r.shard_numel = f.integer("shard_numel", 0, kMaxElements);
    const nlohmann::json& segments = array_at(f, "segments");
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const std::string field = fmt::format("files[{}].segments[{}]", i, s);
      const nlohmann::json& v = segments[s];
      SHARDOPT_CHECK(v.is_array() && v.size() == 4, corrupt,
                     "'{}': {} is {}, not [param, param_offset, shard_offset, length]", path, field, json_excerpt(v));
      partition::Segment seg;
      seg.param = static_cast<int32_t>(json_integer(v[0], 0, INT32_MAX, path, field + " param"));
      seg.param_offset = json_integer(v[1], 0, kMaxElements, path, field + " param_offset");
      seg.shard_offset = json_integer(v[2], 0, kMaxElements, path, field + " shard_offset");
      seg.length = json_integer(v[3], 0, kMaxElements, path, field + " length");
      r.segments.push_back(seg);
    }
    m.files.push_back(std::move(r));
  }
  return m;
}

// The format version `json` claims, or 0 when it does not look like a manifest at all.
int claimed_version(const nlohmann::json& json) {
  if (!json.is_object()) return 0;
  // Typed look-ups only: json.value("format", string) throws when "format" is not a string.
  const auto format = json.find("format");
  if (format == json.end() || !format->is_string() || format->get_ref<const std::string&>() != kFormatName) return 0;
  const auto it = json.find("format_version");
  if (it == json.end() || !it->is_number_unsigned() || it->get<uint64_t>() > INT32_MAX) return 0;
  return static_cast<int>(it->get<uint64_t>());
}

}  // namespace

Algorithm group_algorithm(const Manifest& m, std::size_t g) {
  return g < m.group_algorithms.size() ? m.group_algorithms[g] : m.algorithm;
}

std::vector<partition::ParamInfo> layout_infos(const Manifest& m) {
  std::vector<partition::ParamInfo> infos;
  for (const ManifestParam& p : m.params) {
    const auto g = static_cast<std::size_t>(p.group);
    infos.push_back(optim::layout_info(p.numel, p.group, p.trainable, group_algorithm(m, g), p.shape, m.groups[g]));
  }
  return infos;
}

namespace {

ojson param_to_json(const ManifestParam& p) {
  ojson j{{"name", p.name}, {"numel", p.numel}, {"dtype", dtype_name(p.dtype)}, {"group", p.group}};
  if (!p.shape.empty()) j["shape"] = p.shape;
  j["trainable"] = p.trainable;
  j["step"] = p.step;
  j["has_momentum_buffer"] = p.has_momentum_buffer;
  if (p.q8) j["state_precision"] = "q8";
  return j;
}

}  // namespace

std::vector<bool> q8_params(const Manifest& manifest) {
  std::vector<bool> out;
  for (const ManifestParam& p : manifest.params) out.push_back(p.q8);
  return out;
}

bool any_q8(const Manifest& manifest) {
  return std::any_of(manifest.params.begin(), manifest.params.end(), [](const ManifestParam& p) { return p.q8; });
}

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
  j["format_version"] = kFormatVersion;
  j["generation"] = m.generation;
  j["save_id"] = m.save_id;
  j["world_size"] = m.world_size;
  j["partition"] = strategy_name(m.partition);
  j["alignment"] = m.alignment;
  j["algorithm"] = algorithm_name(m.algorithm);
  j["state_kinds"] = m.state_kinds;
  if (m.has_loss_scale) j["loss_scaling"] = ojson{{"scale", m.loss_scale}, {"growth_tracker", m.growth_tracker}};
  if (m.moments_by_algorithm) j["moment_placement"] = "by_algorithm";
  j["groups"] = ojson::array();
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    j["groups"].push_back(group_to_json(m.groups[g], group_algorithm(m, g), m.algorithm));
  }
  j["params"] = ojson::array();
  for (const ManifestParam& p : m.params) j["params"].push_back(param_to_json(p));
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
  return seal_json(j, kChecksumKey);
}

Manifest parse_manifest(const std::string& text, const std::string& path, bool accept_version_1) {
  const auto checksum = find_seal(text, kChecksumKey);
  int version = 0;
  nlohmann::json json;
  if (checksum) {
    // Checked before anything is read from the file: a changed byte, the version included,
    // is reported as the corruption it is.
    const uint32_t computed = seal_of(text, checksum->first);
    SHARDOPT_CHECK(computed == checksum->second, corrupt,
                   "'{}' is corrupt: its manifest_crc32c says {:08x} but its contents hash to {:08x} (changed after it "
                   "was written)",
                   path, checksum->second, computed);
    json = parse_json_strict(text, path, "the manifest");
    const JsonObject j(json, path, "");
    SHARDOPT_CHECK(j.has("format") && j.string("format") == kFormatName, corrupt,
                   "'{}' is not a shardopt checkpoint manifest (no \"format\": \"{}\")", path, kFormatName);
    version = static_cast<int>(j.integer("format_version", 1, INT32_MAX));
    SHARDOPT_CHECK(version <= kFormatVersion, unsupported,
                   "'{}' has format version {}, newer than this shardopt reads (up to {}): upgrade shardopt", path,
                   version, kFormatVersion);
    SHARDOPT_CHECK(version == kFormatVersion, corrupt, "'{}' says format version {} but carries a version-{} checksum",
                   path, version, kFormatVersion);
    SHARDOPT_CHECK(j.string("manifest_crc32c") == text.substr(checksum->first, kSealDigits), internal,
                   "'{}': the checksum member and the file's end differ", path);
  } else {
    // No checksum at the end: another format version, or a damaged file. The version, when it
    // can be read at all, says which.
    try {
      json = parse_json_strict(text, path, "the manifest");
      version = claimed_version(json);
    } catch (const Error&) {
      version = 0;
    }
    SHARDOPT_CHECK(version <= kFormatVersion, unsupported,
                   "'{}' has format version {}, newer than this shardopt reads (up to {}): upgrade shardopt", path,
                   version, kFormatVersion);
    SHARDOPT_CHECK(version != 1 || accept_version_1, unsupported,
                   "'{}' has format version 1, which carries no checksum of its own and is no longer loaded: "
                   "`shardopt-ckpt upgrade` checks every shard file against it and rewrites it as version {}",
                   path, kFormatVersion);
    SHARDOPT_CHECK(version == 1, corrupt,
                   "'{}' is corrupt: it does not end with its checksum (\"manifest_crc32c\": \"<8 hex digits>\"), "
                   "so it was truncated or changed after it was written",
                   path);
  }
  Manifest m;
  try {
    m = manifest_from_json(json, path, version);
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}' is malformed: {}", path, e.what());
  }
  check_manifest(m, path);
  return m;
}

Manifest read_manifest(const std::string& dir, bool accept_version_1) {
  const std::string path = join_path(dir, kManifestName);
  const int64_t size = file_size_or_missing(path);
  SHARDOPT_CHECK(size >= 0, io, "no checkpoint in '{}': '{}' is missing", dir, path);
  SHARDOPT_CHECK(size <= kMaxManifestBytes, corrupt, "'{}' is {} bytes, more than any manifest (corrupt?)", path, size);
  return parse_manifest(read_whole_file(path), path, accept_version_1);
}

std::string params_summary_json(const Manifest& m) {
  ojson j = ojson::array();
  for (const ManifestParam& p : m.params) j.push_back(param_to_json(p));
  return j.dump();
}

std::string groups_summary_json(const Manifest& m) {
  ojson j = ojson::array();
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    ojson group = group_to_json(m.groups[g], group_algorithm(m, g), m.algorithm);
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
