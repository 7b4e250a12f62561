// src/checkpoint/json_reader.hpp — strict reading of the JSON that checkpoint files hold: no duplicate keys, typed and ranged fields.
//
// nlohmann::json converts silently where a checkpoint must refuse: a duplicate key keeps the
// last value, get<int64_t>() of 1e30 is a float-to-integer overflow (undefined behaviour),
// get<int>() of 2^40 wraps. Every field of a manifest or safetensors header is read through
// these helpers instead; each failure is Error(corrupt) naming the file and the field.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace shardopt {
namespace checkpoint {

// Parses `text`, the `what` of file `path` ("the safetensors header"), refusing invalid JSON
// and any object that names a key twice.
nlohmann::json parse_json_strict(const std::string& text, const std::string& path, const char* what);

// A short, printable rendering of `value` for messages (long values are cut).
std::string json_excerpt(const nlohmann::json& value);

// An integer JSON value (not a float, not a bool) within [lo, hi]; `field` names it.
int64_t json_integer(const nlohmann::json& value, int64_t lo, int64_t hi, const std::string& path,
                     const std::string& field);

// The members of one JSON object of a checkpoint file. `field` names the object in messages
// ("params[3]"); an empty one is the top level.
class JsonObject {
 public:
  JsonObject(const nlohmann::json& value, std::string path, std::string field);

  const nlohmann::json& at(const char* key) const;  // present, of any type
  bool has(const char* key) const { return json_.contains(key); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const;
  uint64_t unsigned_integer(const char* key, uint64_t hi) const;
  double number(const char* key) const;  // an integer or a float
  bool boolean(const char* key) const;
  std::string string(const char* key) const;
  // Error(corrupt) naming the first member whose key is not in `known`.
  void only(std::initializer_list<const char*> known) const;
  // "params[3].numel", for messages.
  std::string name(const char* key) const;
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& json_;
  std::string path_;
  std::string field_;
};

}  // namespace checkpoint
}  // namespace shardopt
