// tests/checkpoint/corpus_shard_mutants.cpp — mutants of the shard files: bit flips, truncations, swaps, and safetensors header edits with every checksum recomputed.
#include <cstdint>
#include <cstring>
#include <string>

#include "ckpt_test_support.hpp"
#include "corpus.hpp"
#include "corpus_edit.hpp"

namespace shardopt_test {
namespace {

using shardopt::ErrorCode;
using J = nlohmann::ordered_json;

const std::string kS0 = "-00000-of-00002.safetensors";
const std::string kS1 = "-00001-of-00002.safetensors";

Mutant raw(std::string name, std::string base, ErrorCode code, std::vector<std::string> needles, std::string what,
           std::function<void(CorpusDir&)> apply) {
  return Mutant{std::move(name), std::move(base), code, std::move(needles), std::move(what), std::move(apply)};
}

// A header edit of shard file `index`, its CRC32C and size in the manifest and the manifest's
// checksum recomputed: only the header checks can refuse it.
Mutant header(std::string name, std::string base, int index, ErrorCode code, std::vector<std::string> needles,
              std::string what, std::function<void(J&, std::string&)> edit) {
  needles.insert(needles.begin(), index == 0 ? kS0 : kS1);
  return Mutant{std::move(name), std::move(base), code, std::move(needles), std::move(what),
                [index, edit](CorpusDir& d) { d.edit_shard(index, edit); }};
}

int64_t header_length(const std::string& path) {
  const std::string bytes = file_bytes(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return static_cast<int64_t>(length);
}

std::vector<Mutant> byte_mutants() {
  std::vector<Mutant> v;
  v.push_back(raw("shard-flip-data-last", "adam", ErrorCode::corrupt, {kS1, "is corrupt: CRC32C"}, "one bit of the last data byte",
                  [](CorpusDir& d) { d.flip_bit(d.shard_path(1), -1, 0); }));
  v.push_back(raw("shard-flip-data-first", "adam", ErrorCode::corrupt, {kS0, "is corrupt: CRC32C"}, "one bit of the first data byte",
                  [](CorpusDir& d) { d.flip_bit(d.shard_path(0), 8 + header_length(d.shard_path(0)), 7); }));
  v.push_back(raw("shard-flip-data-frozen", "adam", ErrorCode::corrupt, {kS0, "is corrupt: CRC32C"},
                  "one bit of frozen_params (the last bytes of file 0)", [](CorpusDir& d) { d.flip_bit(d.shard_path(0), -3, 2); }));
  v.push_back(raw("shard-flip-sgd-momentum", "sgd", ErrorCode::corrupt, {kS1, "is corrupt: CRC32C"},
                  "one bit of SGD's momentum buffer", [](CorpusDir& d) { d.flip_bit(d.shard_path(1), -8, 4); }));
  v.push_back(raw("shard-flip-header-brace", "adam", ErrorCode::corrupt, {kS0, "is corrupt: CRC32C", "the safetensors header is not valid JSON"},
                  "one bit of the header's opening brace", [](CorpusDir& d) { d.flip_bit(d.shard_path(0), 8, 0); }));
  v.push_back(raw("shard-flip-header-tail", "adam", ErrorCode::corrupt, {kS1, "is corrupt: CRC32C", "the safetensors header is not valid JSON"},
                  "one bit of the header's last byte (padding or closing brace)",
                  [](CorpusDir& d) { d.flip_bit(d.shard_path(1), 8 + header_length(d.shard_path(1)) - 1, 0); }));
  v.push_back(raw("shard-flip-header-offset", "adam", ErrorCode::corrupt, {kS1, "is corrupt: CRC32C", "invalid offset"},
                  "one bit of a tensor's start offset", [](CorpusDir& d) {
                    const std::string at = "\"exp_avg\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[";
                    d.flip_bit(d.shard_path(1), d.offset_of(d.shard_path(1), at, static_cast<int64_t>(at.size())), 0);
                  }));
  v.push_back(raw("shard-flip-length-word", "adam", ErrorCode::corrupt, {kS0, "is corrupt: CRC32C", "more than the 100 MiB"},
                  "the top bit of the header length word", [](CorpusDir& d) { d.flip_bit(d.shard_path(0), 7, 7); }));
  v.push_back(raw("shard-flip-metadata", "adam", ErrorCode::corrupt, {kS0, "is corrupt: CRC32C", "its metadata 'format' is 'shardopt-sh"},
                  "one bit of the format name in the metadata",
                  [](CorpusDir& d) { d.flip_bit(d.shard_path(0), d.offset_of(d.shard_path(0), "shardopt-shard", 13), 0); }));
  v.push_back(raw("shard-truncated-1", "adam", ErrorCode::corrupt, {kS1, "bytes but the manifest says", "(truncated)"},
                  "the last byte cut", [](CorpusDir& d) {
                    const std::string b = file_bytes(d.shard_path(1));
                    write_bytes(d.shard_path(1), b.substr(0, b.size() - 1));
                  }));
  v.push_back(raw("shard-truncated-7", "adam", ErrorCode::corrupt, {kS0, "has 7 bytes but the manifest says", "(truncated)"},
                  "cut inside the length word", [](CorpusDir& d) {
                    write_bytes(d.shard_path(0), file_bytes(d.shard_path(0)).substr(0, 7));
                  }));
  v.push_back(raw("shard-empty", "sgd", ErrorCode::corrupt, {kS0, "has 0 bytes", "(truncated)"}, "zero bytes",
                  [](CorpusDir& d) { write_bytes(d.shard_path(0), ""); }));
  v.push_back(raw("shard-appended", "adam", ErrorCode::corrupt, {kS1, "(extra bytes)"}, "four bytes appended",
                  [](CorpusDir& d) { write_bytes(d.shard_path(1), file_bytes(d.shard_path(1)) + std::string(4, '\0')); }));
  v.push_back(raw("shard-missing", "adam", ErrorCode::io, {kS1, "is missing"}, "shard file 1 deleted",
                  [](CorpusDir& d) { std::filesystem::remove(d.shard_path(1)); }));
  v.push_back(raw("shard-contents-swapped", "adam", ErrorCode::corrupt, {kS0, "bytes but the manifest says"},
                  "the two shard files' contents swapped", [](CorpusDir& d) {
                    const std::string a = file_bytes(d.shard_path(0)), b = file_bytes(d.shard_path(1));
                    write_bytes(d.shard_path(0), b);
                    write_bytes(d.shard_path(1), a);
                  }));
  v.push_back(raw("shard-from-other-save", "adam", ErrorCode::corrupt, {kS1, "is corrupt: CRC32C", "belongs to another save"},
                  "shard file 1 of a later save of the same model, under this save's name",
                  [](CorpusDir& d) { write_bytes(d.shard_path(1), file_bytes(d.other_shard_path(1))); }));
  v.push_back(raw("shard-from-other-save-sealed", "adam", ErrorCode::corrupt, {kS1, "belongs to another save"},
                  "the same, its size and CRC32C recorded in a resealed manifest",
                  [](CorpusDir& d) { d.replace_shard_sealed(1, file_bytes(d.other_shard_path(1))); }));
  return v;
}

std::vector<Mutant> header_mutants() {
  std::vector<Mutant> v;
  // Layout: sorted by offset, contiguous, non-overlapping, covering the data exactly.
  v.push_back(header("header-overlap", "adam", 1, ErrorCode::corrupt, {"invalid offset", "(overlapping tensors)"},
                     "exp_avg on the same bytes as params (the reference reader: invalid offset)", [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "params");
                       set_offsets(h, "exp_avg", b, e);
                     }));
  v.push_back(header("header-overlap-sgd", "sgd", 0, ErrorCode::corrupt, {"invalid offset", "(overlapping tensors)"},
                     "momentum_buffer on the same bytes as params", [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "params");
                       set_offsets(h, "momentum_buffer", b, e);
                     }));
  v.push_back(header("header-overlap-partial", "adam", 1, ErrorCode::corrupt, {"(overlapping tensors)"},
                     "exp_avg starting one element early", [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "exp_avg");
                       set_offsets(h, "exp_avg", b - 4, e - 4);
                     }));
  v.push_back(header("header-gap", "adam", 1, ErrorCode::corrupt, {"(a gap between tensors)"}, "exp_avg starting one element late",
                     [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "exp_avg");
                       set_offsets(h, "exp_avg", b + 4, e + 4);
                     }));
  v.push_back(header("header-first-not-at-zero", "adam", 1, ErrorCode::corrupt, {"the first tensor 'params' starts at data byte 4, not 0"},
                     "every tensor four bytes later, four unclaimed bytes first", [](J& h, std::string& data) {
                       for (const char* t : {"params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
                         const auto [b, e] = offsets_of(h, t);
                         set_offsets(h, t, b + 4, e + 4);
                       }
                       data.insert(0, 4, '\0');
                     }));
  v.push_back(header("header-end-before-begin", "adam", 1, ErrorCode::corrupt, {"tensor 'exp_avg_sq' ends at data byte", "before it starts"},
                     "data_offsets [b, b - 4]", [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "exp_avg_sq");
                       set_offsets(h, "exp_avg_sq", b, b - 4);
                     }));
  v.push_back(header("header-uncovered-data", "adam", 1, ErrorCode::corrupt, {"its tensors end at data byte", "but the file holds"},
                     "eight data bytes no tensor claims", [](J&, std::string& data) { data.append(8, '\0'); }));
  v.push_back(header("header-tensor-beyond-data", "adam", 1, ErrorCode::corrupt, {"tensor 'max_exp_avg_sq' claims data bytes", "(truncated?)"},
                     "the last tensor one element longer than the data", [](J& h, std::string&) {
                       const auto [b, e] = offsets_of(h, "max_exp_avg_sq");
                       set_offsets(h, "max_exp_avg_sq", b, e + 4);
                       h["max_exp_avg_sq"]["shape"][0] = h["max_exp_avg_sq"]["shape"][0].get<int64_t>() + 1;
                     }));
  // Shapes and offsets: integers in range, products checked.
  v.push_back(header("header-shape-overflow", "adam", 1, ErrorCode::corrupt, {"tensor 'params' has shape [2147483648, 8589934592], which overflows a 64-bit size"},
                     "shape [2^31, 2^33] (signed overflow in the old TensorEntry::numel)",
                     [](J& h, std::string&) { h["params"]["shape"] = J::array({int64_t{1} << 31, int64_t{1} << 33}); }));
  v.push_back(header("header-shape-bytes-overflow", "adam", 1, ErrorCode::corrupt, {"tensor 'params' has shape [4611686018427387904], which overflows"},
                     "shape [2^62]: 2^64 bytes", [](J& h, std::string&) { h["params"]["shape"] = J::array({int64_t{1} << 62}); }));
  v.push_back(header("header-shape-2d", "adam", 1, ErrorCode::corrupt, {"tensor 'params' has shape [1, 16], the manifest says [16]"},
                     "params as [1, n]: the same bytes, not the promised shape",
                     [](J& h, std::string&) { h["params"]["shape"] = J::array({1, h["params"]["shape"][0]}); }));
  v.push_back(header("header-shape-short", "adam", 1, ErrorCode::corrupt, {"tensor 'params' spans 64 bytes but its shape [15] needs 60"},
                     "a shape one element short of its bytes", [](J& h, std::string&) { h["params"]["shape"] = J::array({15}); }));
  v.push_back(header("header-shape-float", "adam", 1, ErrorCode::corrupt, {"tensor 'params' shape[0] is 16.5, not an integer"},
                     "a float dimension", [](J& h, std::string&) { h["params"]["shape"] = J::array({16.5}); }));
  v.push_back(header("header-shape-negative", "adam", 1, ErrorCode::corrupt, {"tensor 'params' shape[0] is -16, not an integer in [0,"},
                     "a negative dimension", [](J& h, std::string&) { h["params"]["shape"] = J::array({-16}); }));
  v.push_back(header("header-offset-float", "adam", 1, ErrorCode::corrupt, {"tensor 'params' data_offsets[1] is 1e+30, not an integer"},
                     "an offset of 1e30 (float-to-integer overflow in the old parser)",
                     [](J& h, std::string&) { h["params"]["data_offsets"][1] = 1e30; }));
  v.push_back(header("header-offset-2^64-1", "adam", 1, ErrorCode::corrupt, {"data_offsets[1] is 18446744073709551615, not an integer in [0,"},
                     "an offset of 2^64-1", [](J& h, std::string&) { h["params"]["data_offsets"][1] = UINT64_MAX; }));
  v.push_back(header("header-offsets-three", "adam", 1, ErrorCode::corrupt, {"tensor 'params' has data_offsets", "not two offsets"},
                     "three data_offsets", [](J& h, std::string&) { h["params"]["data_offsets"].push_back(0); }));
  // Entries: F32 only, known fields.
  v.push_back(header("header-dtype-f16", "adam", 1, ErrorCode::unsupported, {"tensor 'exp_avg' has dtype F16; shardopt checkpoints hold F32 only"},
                     "exp_avg as F16", [](J& h, std::string&) { h["exp_avg"]["dtype"] = "F16"; }));
  v.push_back(header("header-entry-extra-field", "adam", 1, ErrorCode::corrupt, {"unknown field 'params.strides'"},
                     "a field no safetensors entry has", [](J& h, std::string&) { h["params"]["strides"] = J::array({1}); }));
  v.push_back(header("header-entry-no-dtype", "adam", 1, ErrorCode::corrupt, {"has no field 'params.dtype'"}, "an entry without dtype",
                     [](J& h, std::string&) { h["params"].erase("dtype"); }));
  v.push_back(header("header-entry-not-object", "adam", 1, ErrorCode::corrupt, {"params is 5, not a JSON object"}, "an entry that is a number",
                     [](J& h, std::string&) { h["params"] = 5; }));
  v.push_back(header("header-not-object", "adam", 1, ErrorCode::corrupt, {"the safetensors header is not a JSON object"},
                     "the header a JSON list", [](J& h, std::string&) { h = J::array(); }));
  // Against the manifest: exactly the promised tensors and metadata.
  v.push_back(header("header-extra-tensor", "adam", 1, ErrorCode::corrupt, {"holds tensor 'bogus', which the manifest does not name"},
                     "an extra tensor, its bytes appended", [](J& h, std::string& data) {
                       const int64_t end = static_cast<int64_t>(data.size());
                       h["bogus"] = J{{"dtype", "F32"}, {"shape", J::array({1})}, {"data_offsets", J::array({end, end + 4})}};
                       data.append(4, '\0');
                     }));
  v.push_back(header("header-missing-tensor", "adam", 1, ErrorCode::corrupt, {"has no tensor 'max_exp_avg_sq' (the manifest says it should)"},
                     "max_exp_avg_sq removed with its bytes", [](J& h, std::string& data) {
                       const auto [b, e] = offsets_of(h, "max_exp_avg_sq");
                       data.erase(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b));
                       h.erase("max_exp_avg_sq");
                     }));
  v.push_back(header("header-frozen-missing", "adam", 0, ErrorCode::corrupt, {"has no tensor 'frozen_params'"},
                     "frozen_params renamed", [](J& h, std::string&) {
                       h["frozen"] = h["frozen_params"];
                       h.erase("frozen_params");
                     }));
  v.push_back(header("header-metadata-index", "adam", 0, ErrorCode::corrupt, {"its metadata 'file_index' is '1', but as file 0 of 2"},
                     "file 0 claiming to be file 1", [](J& h, std::string&) { h["__metadata__"]["file_index"] = "1"; }));
  v.push_back(header("header-metadata-number", "adam", 0, ErrorCode::corrupt, {"__metadata__ 'file_index' is 0, not a string"},
                     "a metadata value that is not a string", [](J& h, std::string&) { h["__metadata__"]["file_index"] = 0; }));
  v.push_back(header("header-metadata-extra", "adam", 0, ErrorCode::corrupt, {"unexpected metadata 'note'"}, "an extra metadata key",
                     [](J& h, std::string&) { h["__metadata__"]["note"] = "x"; }));
  v.push_back(header("header-metadata-missing", "adam", 0, ErrorCode::corrupt, {"its metadata 'file_index' is '(absent)'"},
                     "no __metadata__", [](J& h, std::string&) { h.erase("__metadata__"); }));
  v.push_back(header("header-save-id", "adam", 0, ErrorCode::corrupt, {"belongs to another save"}, "another save id in the metadata",
                     [](J& h, std::string&) { h["__metadata__"]["save_id"] = "g000009-00000000"; }));
  // Text edits JSON cannot express, sealed as well.
  v.push_back(Mutant{"header-duplicate-tensor", "adam", ErrorCode::corrupt, {kS1, "names the key 'params' twice"},
                     "\"params\" given twice", [](CorpusDir& d) {
                       d.edit_shard_text(1, [](std::string& h, std::string&) {
                         const std::size_t at = h.find("\"params\":");
                         const std::size_t end = h.find('}', at);
                         h.insert(at, h.substr(at, end + 1 - at) + ",");
                       });
                     }});
  v.push_back(Mutant{"header-invalid-utf8", "adam", ErrorCode::corrupt, {kS1, "the safetensors header is not valid JSON"},
                     "a tensor name with an invalid UTF-8 byte", [](CorpusDir& d) {
                       d.edit_shard_text(1, [](std::string& h, std::string&) { h.replace(h.find("\"params\""), 8, "\"par\xff" "ms\""); });
                     }});
  v.push_back(Mutant{"header-length-2^64-1", "adam", ErrorCode::corrupt, {kS0, "the header length word says 18446744073709551615 bytes"},
                     "a header length of 2^64-1, the CRC32C recomputed", [](CorpusDir& d) {
                       std::string bytes = file_bytes(d.shard_path(0));
                       std::memset(bytes.data(), 0xff, 8);
                       d.replace_shard_sealed(0, bytes);
                     }});
  v.push_back(Mutant{"header-length-beyond-file", "adam", ErrorCode::corrupt, {kS0, "bytes after it (truncated?)"},
                     "a header length past the end of the file", [](CorpusDir& d) {
                       std::string bytes = file_bytes(d.shard_path(0));
                       const uint64_t length = bytes.size();
                       std::memcpy(bytes.data(), &length, 8);
                       d.replace_shard_sealed(0, bytes);
                     }});
  return v;
}

}  // namespace

std::vector<Mutant> shard_mutants() {
  std::vector<Mutant> v = byte_mutants();
  for (Mutant& m : header_mutants()) v.push_back(std::move(m));
  return v;
}

}  // namespace shardopt_test
