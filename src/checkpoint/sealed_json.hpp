// src/checkpoint/sealed_json.hpp — JSON files that carry their own checksum as their last member (the manifest, local SGD's commit record).
//
// The last member, `key`, holds the CRC32C (8 hex digits) of every byte of the file before
// those digits, the key included, and the file ends right after them ("\"\n}\n"): any changed,
// added or removed byte is detected, and the file stays plain JSON for other readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace shardopt {
namespace checkpoint {

constexpr std::size_t kSealDigits = 8;

// `object` (without `key`) as text indented by one space, `key` and its checksum last.
std::string seal_json(const nlohmann::ordered_json& object, const char* key);

// Where the seal's digits start in `text` and the value they hold; nullopt when `text` does not
// end with a `key` member in the form seal_json() writes.
std::optional<std::pair<std::size_t, uint32_t>> find_seal(const std::string& text, const char* key);

// The CRC32C a seal whose digits start at `digits` must hold.
uint32_t seal_of(const std::string& text, std::size_t digits);

}  // namespace checkpoint
}  // namespace shardopt
