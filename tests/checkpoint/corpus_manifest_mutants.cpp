// tests/checkpoint/corpus_manifest_mutants.cpp — mutants of manifest.json: bit flips, truncations and hand edits, raw or with the checksum recomputed.
#include <cstdint>
#include <string>

#include "ckpt_test_support.hpp"
#include "corpus.hpp"
#include "corpus_edit.hpp"

namespace shardopt_test {
namespace {

using shardopt::ErrorCode;
using J = nlohmann::ordered_json;

const std::string kM = "manifest.json'";
const std::string kSealedBad = "manifest.json' is corrupt: its manifest_crc32c says";
const std::string kNoSeal = "manifest.json' is corrupt: it does not end with its checksum";

Mutant raw(std::string name, std::string base, ErrorCode code, std::vector<std::string> needles, std::string what,
           std::function<void(CorpusDir&)> apply) {
  needles.insert(needles.begin(), kM);
  return Mutant{std::move(name), std::move(base), code, std::move(needles), std::move(what), std::move(apply)};
}

// A manifest edit with its checksum recomputed: only the consistency checks can refuse it.
Mutant sealed(std::string name, std::string base, std::vector<std::string> needles, std::string what,
              std::function<void(J&)> edit) {
  needles.insert(needles.begin(), kM);
  return Mutant{std::move(name), std::move(base), ErrorCode::corrupt, std::move(needles), std::move(what),
                [edit](CorpusDir& d) { d.edit_manifest(edit); }};
}

J& segment(J& m, std::size_t file, std::size_t index) { return m["files"][file]["segments"][index]; }

// Flips bit `bit` of the character `plus` bytes after the first `text` in the manifest.
std::function<void(CorpusDir&)> flip_at(std::string text, int64_t plus, int bit) {
  return [=](CorpusDir& d) { d.flip_bit(d.manifest_path(), d.offset_of(d.manifest_path(), text, plus), bit); };
}

std::vector<Mutant> byte_mutants() {
  std::vector<Mutant> v;
  v.push_back(raw("manifest-flip-lr", "adam", ErrorCode::corrupt, {kSealedBad}, "one bit of group 0's lr",
                  flip_at("\"lr\": ", 6, 0)));
  v.push_back(raw("manifest-flip-param-name", "adam", ErrorCode::corrupt, {kSealedBad}, "one bit of a parameter name",
                  flip_at("\"layer1.weight\"", 3, 1)));
  v.push_back(raw("manifest-flip-segment", "adam", ErrorCode::corrupt, {kSealedBad}, "one bit of a segment",
                  flip_at("\"segments\": [", 25, 0)));
  v.push_back(raw("manifest-flip-version", "adam", ErrorCode::corrupt, {kSealedBad},
                  "format_version 2 -> 3 by one bit: corruption, not a newer format", flip_at("\"format_version\": 2", 18, 0)));
  v.push_back(raw("manifest-flip-whitespace", "adam", ErrorCode::corrupt, {kSealedBad}, "one bit of a newline",
                  flip_at("\n", 0, 3)));
  v.push_back(raw("manifest-flip-checksum-digit", "adam", ErrorCode::corrupt, {"manifest.json' is corrupt"},
                  "one bit of the stored checksum", [](CorpusDir& d) { d.flip_bit(d.manifest_path(), -12, 0); }));
  v.push_back(raw("manifest-flip-checksum-key", "adam", ErrorCode::corrupt, {kNoSeal}, "one bit of the checksum's key",
                  flip_at("manifest_crc32c", 9, 0)));
  v.push_back(raw("manifest-flip-last-byte", "adam", ErrorCode::corrupt, {kNoSeal}, "one bit of the final newline",
                  [](CorpusDir& d) { d.flip_bit(d.manifest_path(), -1, 0); }));
  v.push_back(raw("manifest-state-kinds-emptied", "sgd", ErrorCode::corrupt, {kSealedBad},
                  "\"state_kinds\": [] by hand (would drop SGD momentum)", [](CorpusDir& d) {
                    d.replace_text(d.manifest_path(), "\"state_kinds\": [\n  \"momentum_buffer\"\n ]", "\"state_kinds\": []");
                  }));
  v.push_back(raw("manifest-param-renamed", "adam", ErrorCode::corrupt, {kSealedBad}, "a parameter renamed by hand",
                  [](CorpusDir& d) { d.replace_text(d.manifest_path(), "\"layer1.weight\"", "\"layer1.bias\""); }));
  v.push_back(raw("manifest-hyper-changed", "adam", ErrorCode::corrupt, {kSealedBad}, "weight_decay changed by hand",
                  [](CorpusDir& d) { d.replace_text(d.manifest_path(), "\"weight_decay\": 0.02", "\"weight_decay\": 0.03"); }));
  v.push_back(raw("manifest-segment-changed", "adam", ErrorCode::corrupt, {kSealedBad}, "a segment's length changed by hand",
                  [](CorpusDir& d) { d.replace_text(d.manifest_path(), "    5\n", "    4\n"); }));
  v.push_back(raw("manifest-truncated-tail", "adam", ErrorCode::corrupt, {kNoSeal}, "the last 10 bytes cut",
                  [](CorpusDir& d) {
                    const std::string t = file_bytes(d.manifest_path());
                    write_bytes(d.manifest_path(), t.substr(0, t.size() - 10));
                  }));
  v.push_back(raw("manifest-truncated-half", "adam", ErrorCode::corrupt, {kNoSeal}, "cut in half", [](CorpusDir& d) {
    const std::string t = file_bytes(d.manifest_path());
    write_bytes(d.manifest_path(), t.substr(0, t.size() / 2));
  }));
  v.push_back(raw("manifest-empty", "adam", ErrorCode::corrupt, {kNoSeal}, "zero bytes",
                  [](CorpusDir& d) { write_bytes(d.manifest_path(), ""); }));
  v.push_back(raw("manifest-appended", "adam", ErrorCode::corrupt, {kNoSeal}, "one newline appended",
                  [](CorpusDir& d) { write_bytes(d.manifest_path(), file_bytes(d.manifest_path()) + "\n"); }));
  v.push_back(raw("manifest-missing", "adam", ErrorCode::io, {"manifest.json' is missing"}, "no manifest.json",
                  [](CorpusDir& d) { std::filesystem::remove(d.manifest_path()); }));
  v.push_back(raw("manifest-version-1", "adam", ErrorCode::unsupported, {"format version 1", "shardopt-ckpt upgrade"},
                  "a version-1 manifest (no checksum of its own): refused, upgrade offered", [](CorpusDir& d) {
                    J j = manifest_json(file_bytes(d.manifest_path()));
                    j["format_version"] = 1;
                    write_bytes(d.manifest_path(), j.dump(1) + "\n");
                  }));
  v.push_back(Mutant{"manifest-version-3-sealed", "adam", ErrorCode::unsupported, {kM, "format version 3, newer"},
                     "format_version 3 with a valid checksum: a newer format",
                     [](CorpusDir& d) { d.edit_manifest([](J& m) { m["format_version"] = 3; }); }});
  return v;
}

std::vector<Mutant> sealed_mutants() {
  std::vector<Mutant> v;
  // State kinds: a manifest listing fewer kinds than the groups need would load zeros.
  v.push_back(sealed("sealed-state-kinds-empty-sgd", "sgd", {"state_kinds lacks 'momentum_buffer'"},
                     "\"state_kinds\": [] for SGD with momentum", [](J& m) { m["state_kinds"] = J::array(); }));
  v.push_back(sealed("sealed-state-kinds-empty-adam", "adam", {"state_kinds lacks 'exp_avg'"}, "\"state_kinds\": [] for AdamW",
                     [](J& m) { m["state_kinds"] = J::array(); }));
  v.push_back(sealed("sealed-state-kind-amsgrad-dropped", "adam", {"state_kinds lacks 'max_exp_avg_sq'"},
                     "max_exp_avg_sq dropped though group 0 has amsgrad",
                     [](J& m) { m["state_kinds"] = J::array({"exp_avg", "exp_avg_sq"}); }));
  v.push_back(sealed("sealed-state-kind-unknown", "sgd", {"'velocity', not a state kind"}, "an unknown state kind",
                     [](J& m) { m["state_kinds"].push_back("velocity"); }));
  v.push_back(sealed("sealed-state-kind-twice", "sgd", {"lists 'momentum_buffer' twice or out of order"},
                     "a state kind listed twice", [](J& m) { m["state_kinds"].push_back("momentum_buffer"); }));
  v.push_back(sealed("sealed-state-kind-foreign", "adam", {"'momentum_buffer', which a adamw optimizer"},
                     "an SGD state kind in an AdamW checkpoint", [](J& m) { m["state_kinds"].push_back("momentum_buffer"); }));
  v.push_back(sealed("sealed-momentum-flag-without-kind", "adam", {"has a momentum buffer but state_kinds lacks"},
                     "has_momentum_buffer without the kind", [](J& m) { m["params"][0]["has_momentum_buffer"] = true; }));
  // Hyperparameters: the checks a step makes, in verify and load alike.
  v.push_back(sealed("sealed-lr-negative", "adam", {"groups[0] holds hyperparameters no optimizer accepts", "invalid lr -1"},
                     "lr = -1", [](J& m) { m["groups"][0]["lr"] = -1; }));
  v.push_back(sealed("sealed-beta1-one", "adam", {"invalid beta1 1"}, "beta1 = 1", [](J& m) { m["groups"][1]["beta1"] = 1.0; }));
  v.push_back(sealed("sealed-nesterov-with-dampening", "sgd", {"nesterov momentum requires"}, "nesterov with dampening",
                     [](J& m) { m["groups"][0]["nesterov"] = true; }));
  v.push_back(sealed("sealed-lr-string", "adam", {"groups[0].lr is \"0.01\", not a number"}, "lr as a string",
                     [](J& m) { m["groups"][0]["lr"] = "0.01"; }));
  v.push_back(sealed("sealed-group-field-missing", "adam", {"has no field 'groups[1].eps'"}, "a group without eps",
                     [](J& m) { m["groups"][1].erase("eps"); }));
  // Segments: ranges, overflow, tiling.
  v.push_back(sealed("sealed-segment-length-int64-max", "adam",
                     {"files[0].segments[0] length is 9223372036854775807, not an integer in [0, 72057594037927936]"},
                     "a segment of 2^63-1 elements from element 1 (signed overflow in the old check)", [](J& m) {
                       segment(m, 0, 0)[1] = 1;
                       segment(m, 0, 0)[3] = INT64_MAX;
                     }));
  v.push_back(sealed("sealed-segment-offset-float", "adam", {"files[0].segments[0] param_offset is 1e+30, not an integer"},
                     "a float offset (float-to-integer overflow in the old parser)",
                     [](J& m) { segment(m, 0, 0)[1] = 1e30; }));
  v.push_back(sealed("sealed-segment-negative", "adam", {"files[0].segments[1] shard_offset is -1"}, "a negative offset",
                     [](J& m) { segment(m, 0, 1)[2] = -1; }));
  v.push_back(sealed("sealed-segment-shortened", "adam", {"the segments of 'layer0.weight' cover 4 of its 5 elements"},
                     "a segment one element short", [](J& m) { segment(m, 0, 0)[3] = 4; }));
  v.push_back(sealed("sealed-segment-outside-shard", "adam", {"files[0].segments[0]", "lies outside 'layer0.weight'"},
                     "a segment beyond its shard",
                     [](J& m) { segment(m, 0, 0)[2] = m["files"][0]["shard_numel"].get<int64_t>() - 1; }));
  v.push_back(sealed("sealed-segment-param-index", "adam", {"files[0].segments[0] is of parameter #99 (there are 6)"},
                     "a segment of a parameter that does not exist", [](J& m) { segment(m, 0, 0)[0] = 99; }));
  v.push_back(sealed("sealed-segment-arity", "adam", {"files[0].segments[0] is [0,0,0], not [param, param_offset"},
                     "a segment of three numbers", [](J& m) { segment(m, 0, 0) = J::array({0, 0, 0}); }));
  v.push_back(sealed("sealed-segments-share-bytes", "adam", {"two segments of files[0] overlap at shard element 0"},
                     "two parameters reading the same shard bytes", [](J& m) { segment(m, 0, 1)[2] = 0; }));
  v.push_back(sealed("sealed-segments-overlap-param", "adam", {"the segments of 'layer0.weight' overlap at element 0"},
                     "a parameter's elements stored twice (in file 1's padding)", [](J& m) {
                       // File 1 holds its segments at the front of a shard padded to the alignment:
                       // a copy of file 0's first segment fits behind them.
                       J copy = segment(m, 0, 0);
                       int64_t end = 0;
                       for (const J& s : m["files"][1]["segments"]) end = std::max(end, s[2].get<int64_t>() + s[3].get<int64_t>());
                       if (end + copy[3].get<int64_t>() > m["files"][1]["shard_numel"].get<int64_t>()) {
                         throw std::runtime_error("sealed-segments-overlap-param: no room in file 1");
                       }
                       copy[2] = end;
                       m["files"][1]["segments"].push_back(copy);
                     }));
  // Parameters.
  v.push_back(sealed("sealed-numel-float", "adam", {"params[0].numel is 5.0, not an integer"}, "numel 5.0",
                     [](J& m) { m["params"][0]["numel"] = 5.0; }));
  v.push_back(sealed("sealed-numel-huge", "adam", {"params[0].numel is 4611686018427387904, not an integer in [0, 72057594037927936]"},
                     "numel 2^62", [](J& m) { m["params"][0]["numel"] = int64_t{1} << 62; }));
  v.push_back(sealed("sealed-numel-changed", "adam", {"the segments of 'layer0.weight' cover 5 of its 6 elements"}, "numel 5 -> 6",
                     [](J& m) { m["params"][0]["numel"] = 6; }));
  v.push_back(sealed("sealed-step-negative", "adam", {"params[0].step is -1, not an integer"}, "step -1",
                     [](J& m) { m["params"][0]["step"] = -1; }));
  v.push_back(sealed("sealed-step-2^64", "adam", {"params[0].step is 1.8446744073709552e+19, not an integer"},
                     "step 2^64 (parsed as a float)", [](J& m) { m["params"][0]["step"] = 18446744073709551616.0; }));
  v.push_back(sealed("sealed-group-out-of-range", "adam", {"is in group 7 but there are 2 groups"}, "group 7 of 2",
                     [](J& m) { m["params"][0]["group"] = 7; }));
  v.push_back(sealed("sealed-dtype-unknown", "adam", {"params[0].dtype is 'f64', not a dtype"}, "dtype f64",
                     [](J& m) { m["params"][0]["dtype"] = "f64"; }));
  v.push_back(sealed("sealed-dtype-mixed", "adam", {"params[1] 'layer1.weight' is bf16 but params[0] is f32"}, "mixed dtypes",
                     [](J& m) { m["params"][1]["dtype"] = "bf16"; }));
  v.push_back(sealed("sealed-frozen-made-trainable", "adam", {"the segments of 'layer4.weight' cover 0 of its 2 elements"},
                     "a frozen parameter marked trainable", [](J& m) { m["params"][4]["trainable"] = true; }));
  v.push_back(sealed("sealed-trainable-made-frozen", "adam", {"frozen parameter 'layer0.weight' has a segment in files[0]"},
                     "a trainable parameter marked frozen", [](J& m) { m["params"][0]["trainable"] = false; }));
  v.push_back(sealed("sealed-trainable-string", "adam", {"params[0].trainable is \"yes\", not true or false"},
                     "trainable as a string", [](J& m) { m["params"][0]["trainable"] = "yes"; }));
  v.push_back(sealed("sealed-params-not-list", "adam", {"params is {}, not a list"}, "params as an object",
                     [](J& m) { m["params"] = J::object(); }));
  // The whole checkpoint.
  v.push_back(sealed("sealed-algorithm-changed", "adam", {"state_kinds holds 'exp_avg', which a sgd optimizer"},
                     "algorithm adamw -> sgd", [](J& m) { m["algorithm"] = "sgd"; }));
  v.push_back(sealed("sealed-algorithm-unknown", "adam", {"unknown algorithm 'lamb'"}, "algorithm lamb",
                     [](J& m) { m["algorithm"] = "lamb"; }));
  v.push_back(sealed("sealed-partition-unknown", "adam", {"unknown partition 'striped'"}, "partition striped",
                     [](J& m) { m["partition"] = "striped"; }));
  v.push_back(sealed("sealed-world-size-mismatch", "adam", {"2 shard files listed, expected 3"}, "world_size 3 with 2 files",
                     [](J& m) { m["world_size"] = 3; }));
  v.push_back(sealed("sealed-world-size-huge", "adam", {"world_size is 1099511627776, not an integer in [1, 16777216]"},
                     "world_size 2^40 (would wrap an int)", [](J& m) { m["world_size"] = int64_t{1} << 40; }));
  v.push_back(sealed("sealed-world-size-float", "adam", {"world_size is 3.7, not an integer in [1, 16777216]"},
                     "world_size 3.7 (was truncated to 3)", [](J& m) { m["world_size"] = 3.7; }));
  // Alignment: an integer, a power of two, within what a layout takes, and the one its
  // partition has (flat shards hold whole aligned blocks).
  v.push_back(sealed("sealed-alignment-float-huge", "adam", {"alignment is 7.7e+61, not an integer in [1, 1048576]"},
                     "alignment 7.7e61 (float-to-integer overflow in the old parser)",
                     [](J& m) { m["alignment"] = 7.7e61; }));
  v.push_back(sealed("sealed-alignment-too-large", "adam", {"alignment is 2097152, not an integer in [1, 1048576]"},
                     "alignment 2^21", [](J& m) { m["alignment"] = int64_t{1} << 21; }));
  v.push_back(sealed("sealed-alignment-not-power-of-two", "adam", {"alignment 3 is not a power of two in [1, 1048576]"},
                     "alignment 3", [](J& m) { m["alignment"] = 3; }));
  v.push_back(sealed("sealed-alignment-not-dividing-shards", "adam",
                     {"files[0] has shard_numel", "flat shards all hold the same multiple of the alignment 1048576"},
                     "alignment 2^20, more than a shard holds", [](J& m) { m["alignment"] = int64_t{1} << 20; }));
  v.push_back(sealed("sealed-alignment-sorted-greedy", "sgd", {"alignment is 16, but a sorted_greedy layout is unpadded"},
                     "alignment 16 on a sorted_greedy layout", [](J& m) { m["alignment"] = 16; }));
  v.push_back(sealed("sealed-file-crc-2^40", "adam", {"files[0].crc32c is 1099511627776, not an integer in [0, 4294967295]"},
                     "a CRC of 2^40 (was truncated to 32 bits)", [](J& m) { m["files"][0]["crc32c"] = int64_t{1} << 40; }));
  // A number beyond 64 bits: the JSON parser holds it as a float, which is refused, not cast.
  v.push_back(Mutant{"sealed-numel-25-digits", "adam", ErrorCode::corrupt,
                     {kM, "params[0].numel is 1e+24, not an integer in [0, 72057594037927936]"},
                     "a numel of 25 digits", [](CorpusDir& d) {
                       d.edit_manifest_text([](std::string& body) {
                         const std::string key = "\"numel\": 5,";
                         const std::size_t at = body.find(key);
                         if (at == std::string::npos) throw std::runtime_error("sealed-numel-25-digits: no numel 5");
                         body.replace(at, key.size(), "\"numel\": 1000000000000000000000000,");
                       });
                     }});
  v.push_back(sealed("sealed-generation-negative", "adam", {"generation is -1, not an integer in [0, 18446744073709551615]"},
                     "generation -1", [](J& m) { m["generation"] = -1; }));
  v.push_back(sealed("sealed-loss-scale-zero", "adam", {"loss_scaling holds scale 0"}, "a loss scale of 0",
                     [](J& m) { m["loss_scaling"] = J{{"scale", 0}, {"growth_tracker", 0}}; }));
  v.push_back(sealed("sealed-unknown-field", "adam", {"unknown field 'comment'"}, "a member no format version has",
                     [](J& m) { m["comment"] = "edited"; }));
  v.push_back(sealed("sealed-missing-field", "adam", {"has no field 'alignment'"}, "no alignment",
                     [](J& m) { m.erase("alignment"); }));
  v.push_back(sealed("sealed-format-name", "adam", {"is not a shardopt checkpoint manifest"}, "another format's name",
                     [](J& m) { m["format"] = "other-checkpoint"; }));
  v.push_back(Mutant{"sealed-duplicate-key", "adam", ErrorCode::corrupt, {kM, "names the key 'world_size' twice"},
                     "world_size given twice (JSON readers keep either)", [](CorpusDir& d) {
                       d.edit_manifest_text([](std::string& body) {
                         const std::string key = "\n \"world_size\": 2,";
                         const std::size_t at = body.find(key);
                         if (at == std::string::npos) throw std::runtime_error("sealed-duplicate-key: no world_size");
                         body.insert(at + key.size(), "\n \"world_size\": 1,");
                       });
                     }});
  // Files.
  v.push_back(sealed("sealed-files-swapped", "adam", {"files[0] is named 'shard-", "-00001-of-00002.safetensors'; this save names it"},
                     "the two file entries swapped", [](J& m) { std::swap(m["files"][0], m["files"][1]); }));
  v.push_back(sealed("sealed-file-name-traversal", "adam", {"files[1] is named '../manifest.json'"}, "a file outside the directory",
                     [](J& m) { m["files"][1]["name"] = "../manifest.json"; }));
  v.push_back(sealed("sealed-save-id-path", "adam", {"save_id '../x' is not a plain identifier"}, "a save id with a path",
                     [](J& m) { m["save_id"] = "../x"; }));
  v.push_back(sealed("sealed-file-crc-out-of-range", "adam", {"files[1].crc32c is 8589934592, not an integer in [0, 4294967295]"},
                     "a CRC of 2^33", [](J& m) { m["files"][1]["crc32c"] = int64_t{1} << 33; }));
  return v;
}

}  // namespace

std::vector<Mutant> manifest_mutants() {
  std::vector<Mutant> v = byte_mutants();
  for (Mutant& m : sealed_mutants()) v.push_back(std::move(m));
  return v;
}

}  // namespace shardopt_test
