// tests/checkpoint/test_format.cpp — the file format at the byte level: CRC32C, safetensors headers, the manifest and its checksum, strict JSON, checked sizes.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checked_int.hpp"
#include "checkpoint/crc32c.hpp"
#include "checkpoint/json_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "shardopt/error.hpp"

using namespace shardopt;
using namespace shardopt::checkpoint;

TEST_CASE("CRC32C matches the standard check value, streamed or at once", "[checkpoint][format]") {
  const std::string check = "123456789";
  REQUIRE(crc32c_update(0, check.data(), check.size()) == 0xE3069283u);
  REQUIRE(crc32c_update(0, nullptr, 0) == 0u);
  std::vector<unsigned char> bytes(1000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  const uint32_t whole = crc32c_update(0, bytes.data(), bytes.size());
  for (std::size_t cut : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{500}, std::size_t{999}}) {
    REQUIRE(crc32c_update(crc32c_update(0, bytes.data(), cut), bytes.data() + cut, bytes.size() - cut) == whole);
  }
  bytes[123] ^= 0x10;
  REQUIRE(crc32c_update(0, bytes.data(), bytes.size()) != whole);
}

TEST_CASE("safetensors headers: 8-byte aligned data, offsets back to back, refused when inconsistent",
          "[checkpoint][format]") {
  std::vector<TensorEntry> tensors = {{"a", {3}, 0, 0}, {"b", {0}, 0, 0}, {"c", {2}, 0, 0}};
  const std::string header = encode_safetensors_header(tensors, {{"k", "v"}});
  REQUIRE(header.size() % 8 == 0);
  uint64_t length = 0;
  std::memcpy(&length, header.data(), 8);
  REQUIRE(length == header.size() - 8);
  REQUIRE(tensors[0].begin == 0);
  REQUIRE(tensors[0].end == 12);
  REQUIRE(tensors[1].begin == 12);
  REQUIRE(tensors[1].end == 12);
  REQUIRE(tensors[2].end == 20);
  REQUIRE(header.find("\"dtype\":\"F32\"") != std::string::npos);
}

namespace {

// A small consistent manifest: two AdamW parameters in one group, one shard file.
Manifest small_manifest() {
  Manifest m;
  m.generation = 3;
  m.save_id = "g000003-0badcafe";
  m.algorithm = Algorithm::adamw;
  m.state_kinds = {"exp_avg", "exp_avg_sq"};
  m.groups.push_back(default_hyperparams(Algorithm::adamw));
  m.params.push_back({"w", 5, DType::f32, 0, true, 7, false});
  m.params.push_back({"b", 2, DType::f32, 0, true, 7, false});
  ManifestFile f;
  f.name = shard_file_name(m.save_id, 0, 1);
  f.bytes = 1000;
  f.crc32c = 0xdeadbeef;
  f.shard_numel = 8;
  f.segments = {{0, 0, 0, 5}, {1, 0, 5, 2}};
  m.files.push_back(f);
  return m;
}

ErrorCode parse_code(const std::string& text, std::string* message = nullptr) {
  try {
    parse_manifest(text, "dir/manifest.json");
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::internal;  // "accepted": no refusal code
}

}  // namespace

TEST_CASE("manifest.json carries its own CRC32C: any changed, inserted or removed byte is refused", "[checkpoint][format]") {
  const std::string text = manifest_to_json(small_manifest());
  const Manifest back = parse_manifest(text, "dir/manifest.json");
  REQUIRE(back.format_version == kFormatVersion);
  REQUIRE(back.save_id == "g000003-0badcafe");
  REQUIRE(back.files.at(0).segments.at(1).shard_offset == 5);
  REQUIRE(manifest_to_json(back) == text);
  // The last member holds the CRC32C of every byte before its digits, and the file ends there.
  const std::size_t digits = text.size() - 12;
  REQUIRE(text.substr(digits - 23) == ",\n \"manifest_crc32c\": \"" + text.substr(digits, 8) + "\"\n}\n");
  REQUIRE(text.substr(digits, 8) == fmt::format("{:08x}", crc32c_update(0, text.data(), digits)));

  int64_t refused = 0, tried = 0;
  auto expect_refused = [&](const std::string& mutant) {
    std::string message;
    const ErrorCode code = parse_code(mutant, &message);
    ++tried;
    if (code == ErrorCode::corrupt && message.find("dir/manifest.json") != std::string::npos) ++refused;
  };
  for (std::size_t at = 0; at < text.size(); ++at) {
    for (int v = 0; v < 256; ++v) {
      if (static_cast<char>(v) == text[at]) continue;
      std::string changed = text;
      changed[at] = static_cast<char>(v);
      expect_refused(changed);
    }
    expect_refused(text.substr(0, at) + text.substr(at + 1));
    expect_refused(text.substr(0, at) + " " + text.substr(at));
  }
  REQUIRE(refused == tried);
  REQUIRE(tried == static_cast<int64_t>(text.size()) * 257);
}

TEST_CASE("manifest versions: newer refused as unsupported, version 1 only for the upgrade", "[checkpoint][format]") {
  nlohmann::json j = nlohmann::json::parse(manifest_to_json(small_manifest()));
  j.erase("manifest_crc32c");
  j["format_version"] = 1;
  const std::string v1 = j.dump(1) + "\n";
  std::string message;
  REQUIRE(parse_code(v1, &message) == ErrorCode::unsupported);
  REQUIRE(message.find("format version 1, which carries no checksum") != std::string::npos);
  REQUIRE(message.find("shardopt-ckpt upgrade") != std::string::npos);
  REQUIRE(parse_manifest(v1, "m", /*accept_version_1=*/true).format_version == 1);
  j["format_version"] = 7;
  REQUIRE(parse_code(j.dump(1) + "\n", &message) == ErrorCode::unsupported);
  REQUIRE(message.find("format version 7, newer than this shardopt reads") != std::string::npos);
}

TEST_CASE("manifest consistency: sizes beyond int64 are refused without overflowing", "[checkpoint][format]") {
  // The save's proof runs check_manifest on a manifest built in memory: no JSON range check
  // stands before it, so its own arithmetic must not overflow (UBSan runs these).
  auto refused = [](Manifest m, const std::string& needle) {
    try {
      check_manifest(m, "m");
    } catch (const Error& e) {
      CAPTURE(e.what());
      CHECK(e.code() == ErrorCode::corrupt);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("accepted");
  };
  check_manifest(small_manifest(), "m");
  Manifest m = small_manifest();
  m.files[0].segments[0].length = INT64_MAX;
  refused(m, "lies outside 'w'");
  m.files[0].segments[0].param_offset = 1;  // 1 + (2^63 - 1): the old check's overflow
  refused(m, "lies outside 'w'");
  m = small_manifest();
  m.files[0].segments[0].param_offset = INT64_MAX;
  m.files[0].segments[0].shard_offset = INT64_MAX;
  refused(m, "lies outside 'w'");
  m = small_manifest();
  m.params[0].numel = INT64_MAX;
  refused(m, "has numel 9223372036854775807");
  m = small_manifest();
  m.params[0].numel = kMaxElements;
  m.params[1].numel = kMaxElements;
  refused(m, "more than 72057594037927936 elements in all");
  m = small_manifest();
  m.files[0].bytes = INT64_MAX;
  m.files.push_back(m.files[0]);
  m.world_size = 2;
  m.files[1].name = shard_file_name(m.save_id, 1, 2);
  m.files[0].name = shard_file_name(m.save_id, 0, 2);
  m.files[1].segments.clear();
  refused(m, "the shard files' bytes overflow");
}

TEST_CASE("strict JSON: duplicate keys at any depth, and integers that are not int64 values", "[checkpoint][format]") {
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::corrupt);
      return e.what();
    }
    return "accepted";
  };
  CHECK(message_of([] { parse_json_strict(R"({"a": {"b": 1, "c": 2, "b": 3}})", "f", "x"); }) ==
        "'f': x names the key 'b' twice");
  CHECK(message_of([] { parse_json_strict(R"({"a": [{"b": 1}, {"b": 2}]})", "f", "x"); }) == "accepted");
  const nlohmann::json values = nlohmann::json::parse(R"([1e30, 18446744073709551615, -1, true, "1", 2.0, 9223372036854775807])");
  CHECK(message_of([&] { json_integer(values[0], 0, INT64_MAX, "f", "v"); }) == "'f': v is 1e+30, not an integer in [0, 9223372036854775807]");
  CHECK(message_of([&] { json_integer(values[1], 0, INT64_MAX, "f", "v"); }).find("18446744073709551615, not an integer") != std::string::npos);
  CHECK(message_of([&] { json_integer(values[2], 0, 10, "f", "v"); }).find("-1, not an integer in [0, 10]") != std::string::npos);
  CHECK(message_of([&] { json_integer(values[3], 0, 10, "f", "v"); }).find("true, not an integer") != std::string::npos);
  CHECK(message_of([&] { json_integer(values[4], 0, 10, "f", "v"); }).find("\"1\", not an integer") != std::string::npos);
  CHECK(message_of([&] { json_integer(values[5], 0, 10, "f", "v"); }).find("2.0, not an integer") != std::string::npos);
  CHECK(json_integer(values[6], 0, INT64_MAX, "f", "v") == INT64_MAX);
}

TEST_CASE("TensorEntry::numel and checked arithmetic report overflow instead of wrapping", "[checkpoint][format]") {
  const TensorEntry big{"t", {int64_t{1} << 31, int64_t{1} << 33}, 0, 0};
  REQUIRE_THROWS_WITH(big.numel(), Catch::Contains("shape [2147483648, 8589934592] overflows"));
  REQUIRE(TensorEntry{"t", {int64_t{1} << 31, int64_t{1} << 31}, 0, 0}.numel() == int64_t{1} << 62);
  int64_t out = 0;
  REQUIRE(!checked_add(INT64_MAX, 1, &out));
  REQUIRE(!checked_mul(int64_t{1} << 32, int64_t{1} << 31, &out));
  REQUIRE(checked_mul(int64_t{1} << 31, int64_t{1} << 31, &out));
  REQUIRE(out == int64_t{1} << 62);
}
