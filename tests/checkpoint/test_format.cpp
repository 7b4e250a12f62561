// tests/checkpoint/test_format.cpp — CRC32C and safetensors round trips at the byte level.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/safetensors.hpp"

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
