// src/checkpoint/json_reader.cpp — strict JSON parsing and typed field reads for checkpoint files.
#include "checkpoint/json_reader.hpp"

#include <set>
#include <vector>

#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
nlohmann::json parse_json_strict(const std::string& text, const std::string& path, const char* what) {
  // One set of keys per open object: a key seen twice in the same object is remembered (the
  // callback must not throw through the parser) and refused after parsing.
  std::vector<std::set<std::string>> open;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open.emplace_back();
    } else if (event == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == E::key && !open.empty() && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}': {} is not valid JSON ({})", path, what, e.what());
  }
  SHARDOPT_CHECK(duplicate.empty(), corrupt, "'{}': {} names the key '{}' twice", path, what, duplicate);
  return json;
}

std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  constexpr std::size_t kMax = 40;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

int64_t json_integer(const nlohmann::json& value, int64_t lo, int64_t hi, const std::string& path,
                     const std::string& field) {
  // nlohmann stores non-negative integers as number_unsigned and negative ones as
  // number_integer; floats, bools and strings are not integers here.
  bool ok = false;
  int64_t v = 0;
  if (value.is_number_unsigned()) {
    // Compared as unsigned first: values above INT64_MAX must not be converted.
    const auto u = value.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT64_MAX);
    v = ok ? static_cast<int64_t>(u) : 0;
  } else if (value.is_number_integer()) {
    v = value.get<int64_t>();
    ok = true;
  }
  SHARDOPT_CHECK(ok && v >= lo && v <= hi, corrupt, "'{}': {} is {}, not an integer in [{}, {}]", path, field,
                 json_excerpt(value), lo, hi);
  return v;
}

JsonObject::JsonObject(const nlohmann::json& value, std::string path, std::string field)
    : json_(value), path_(std::move(path)), field_(std::move(field)) {
  SHARDOPT_CHECK(json_.is_object(), corrupt, "'{}': {} is {}, not a JSON object", path_,
                 field_.empty() ? std::string("the top level") : field_, json_excerpt(json_));
}

std::string JsonObject::name(const char* key) const { return field_.empty() ? std::string(key) : field_ + "." + key; }

const nlohmann::json& JsonObject::at(const char* key) const {
  const auto it = json_.find(key);
  SHARDOPT_CHECK(it != json_.end(), corrupt, "'{}' has no field '{}'", path_, name(key));
  return *it;
}

int64_t JsonObject::integer(const char* key, int64_t lo, int64_t hi) const {
  return json_integer(at(key), lo, hi, path_, name(key));
}

uint64_t JsonObject::unsigned_integer(const char* key, uint64_t hi) const {
  const nlohmann::json& v = at(key);
  SHARDOPT_CHECK(v.is_number_unsigned() && v.get<uint64_t>() <= hi, corrupt, "'{}': {} is {}, not an integer in [0, {}]",
                 path_, name(key), json_excerpt(v), hi);
  return v.get<uint64_t>();
}

double JsonObject::number(const char* key) const {
  const nlohmann::json& v = at(key);
  SHARDOPT_CHECK(v.is_number(), corrupt, "'{}': {} is {}, not a number", path_, name(key), json_excerpt(v));
  return v.get<double>();
}

bool JsonObject::boolean(const char* key) const {
  const nlohmann::json& v = at(key);
  SHARDOPT_CHECK(v.is_boolean(), corrupt, "'{}': {} is {}, not true or false", path_, name(key), json_excerpt(v));
  return v.get<bool>();
}

std::string JsonObject::string(const char* key) const {
  const nlohmann::json& v = at(key);
  SHARDOPT_CHECK(v.is_string(), corrupt, "'{}': {} is {}, not a string", path_, name(key), json_excerpt(v));
  return v.get<std::string>();
}

void JsonObject::only(std::initializer_list<const char*> known) const {
  for (const auto& [key, value] : json_.items()) {
    bool found = false;
    for (const char* k : known) found = found || key == k;
    SHARDOPT_CHECK(found, corrupt, "'{}': unknown field '{}'", path_, name(key.c_str()));
  }
}

}  // namespace checkpoint
}  // namespace shardopt
