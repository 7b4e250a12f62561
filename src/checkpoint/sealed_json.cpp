// src/checkpoint/sealed_json.cpp — writing and finding a JSON file's own checksum member.
#include "checkpoint/sealed_json.hpp"

#include <fmt/format.h>

#include "checkpoint/crc32c.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {

namespace {

constexpr const char* kSealTail = "\"\n}\n";

std::string seal_lead(const char* key) { return fmt::format(",\n \"{}\": \"", key); }

}  // namespace

std::string seal_json(const nlohmann::ordered_json& object, const char* key) {
  // dump(1) ends the object with "\n}": the checksum member replaces that end.
  std::string text = object.dump(1);
  SHARDOPT_CHECK(text.size() >= 2 && text.compare(text.size() - 2, 2, "\n}") == 0, internal,
                 "seal_json: unexpected end of the encoded object");
  text.resize(text.size() - 2);
  text += seal_lead(key);
  return text + fmt::format("{:08x}", seal_of(text, text.size())) + kSealTail;
}

std::optional<std::pair<std::size_t, uint32_t>> find_seal(const std::string& text, const char* key) {
  const std::string lead = seal_lead(key), tail = kSealTail;
  if (text.size() < lead.size() + kSealDigits + tail.size()) return std::nullopt;
  const std::size_t digits = text.size() - tail.size() - kSealDigits;
  if (text.compare(digits + kSealDigits, tail.size(), tail) != 0) return std::nullopt;
  if (text.compare(digits - lead.size(), lead.size(), lead) != 0) return std::nullopt;
  uint32_t value = 0;
  for (std::size_t i = 0; i < kSealDigits; ++i) {
    const char c = text[digits + i];
    const bool digit = c >= '0' && c <= '9', hex = c >= 'a' && c <= 'f';
    if (!digit && !hex) return std::nullopt;
    value = value * 16 + static_cast<uint32_t>(digit ? c - '0' : c - 'a' + 10);
  }
  return std::make_pair(digits, value);
}

uint32_t seal_of(const std::string& text, std::size_t digits) { return crc32c_update(0, text.data(), digits); }

}  // namespace checkpoint
}  // namespace shardopt
