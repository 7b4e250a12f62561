// tests/checkpoint/test_corpus.cpp — the mutation corpus: the bases load and verify, every mutant is refused by verify and by load alike, with the same named error.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/store.hpp"
#include "ckpt_test_support.hpp"
#include "corpus.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using namespace shardopt_test;
namespace fs = std::filesystem;

namespace {

struct Outcome {
  bool ok = true;
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

// Never FAILs: a call that unexpectedly succeeds on one rank succeeds on all (load agrees), and
// the ranks must go on through the same collectives together.
template <typename Call>
Outcome outcome_of(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return Outcome{false, e.code(), e.what()};
  }
  return Outcome{};
}

// The values a correct load of `dir` installs: every parameter, in registration order, read
// offline from the checkpoint; and the saved steps.
std::pair<std::vector<float>, std::vector<int64_t>> saved_state(const std::string& dir) {
  checkpoint::CheckpointReader reader(dir, checkpoint::read_manifest(dir));
  const checkpoint::Manifest& m = reader.manifest();
  std::vector<float> values;
  std::vector<int64_t> steps;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    std::vector<float> v(static_cast<std::size_t>(m.params[i].numel));
    if (m.params[i].trainable) {
      reader.read_param_range(checkpoint::kParamsTensor, static_cast<int32_t>(i), 0, m.params[i].numel, v.data());
    } else {
      reader.read_frozen(static_cast<int32_t>(i), v.data());
    }
    reader.flush();
    values.insert(values.end(), v.begin(), v.end());
    steps.push_back(m.params[i].step);
  }
  return {values, steps};
}

// Verify (offline, on every rank) and load (collective) must both refuse `dir` with `code`
// and messages holding every needle, and the refused load must leave `opt` as it was.
void expect_refused_alike(ZeroOptimizer& opt, const std::string& dir, ErrorCode code,
                          const std::vector<std::string>& needles, const std::string& name) {
  const std::vector<float> before = all_params(opt);
  const std::vector<int64_t> steps = all_steps(opt);
  const Outcome verified = outcome_of([&] { verify_checkpoint(dir); });
  const Outcome loaded = outcome_of([&] { opt.load(dir); });
  CAPTURE(name, verified.message, loaded.message);
  CHECK(!verified.ok);
  CHECK(!loaded.ok);
  CHECK(verified.code == code);
  CHECK(loaded.code == code);
  for (const std::string& needle : needles) {
    CHECK(verified.message.find(needle) != std::string::npos);
    CHECK(loaded.message.find(needle) != std::string::npos);
  }
  CHECK(bitwise_equal(all_params(opt), before));
  CHECK(all_steps(opt) == steps);
}

// The whole corpus in `corpus`: bases good, every mutant refused alike, nothing unlisted.
void check_corpus(const std::string& corpus) {
  std::set<std::string> listed;
  for (const auto& e : fs::directory_iterator(corpus + "/mutants")) listed.insert(e.path().filename().string());
  std::set<std::string> expected;
  for (const Mutant& m : all_mutants()) expected.insert(m.name);
  REQUIRE(listed == expected);  // a mutant on disk that no test checks, or one missing
  // INDEX says what each mutant is and how it must be refused, for readers in other languages.
  std::ifstream index(corpus + "/INDEX");
  std::string line;
  std::getline(index, line);
  for (const Mutant& m : all_mutants()) {
    REQUIRE(std::getline(index, line));
    CHECK(line == m.name + '\t' + m.base + '\t' + error_code_name(m.code) + '\t' + m.what);
  }

  int refused = 0;
  for (const std::string& base : corpus_bases()) {
    const std::string dir = corpus + "/base-" + base;
    CAPTURE(base);
    verify_checkpoint(dir);
    const CheckpointInfo info = read_checkpoint_info(dir);
    REQUIRE(info.format_version == 2);
    REQUIRE(info.num_files == 2);
    REQUIRE(info.max_step == 3);
    Model model(corpus_sizes(), 999);
    auto opt = make_corpus_optimizer(world(), base, model);
    opt->load(dir);
    const auto [values, steps] = saved_state(dir);
    REQUIRE(bitwise_equal(all_params(*opt), values));
    REQUIRE(all_steps(*opt) == steps);
    for (const Mutant& m : all_mutants()) {
      if (m.base != base) continue;
      expect_refused_alike(*opt, corpus + "/mutants/" + m.name, m.code, m.needles, m.name);
      ++refused;
    }
  }
  REQUIRE(refused == static_cast<int>(all_mutants().size()));
}

}  // namespace

TEST_CASE("the checked-in corpus: bases load bitwise, every mutant refused by verify and load alike",
          "[checkpoint][corpus]") {
  check_corpus(SHARDOPT_TEST_CORPUS);
}

TEST_CASE("a corpus generated now from fresh saves: the same", "[checkpoint][corpus]") {
  const std::string out = scratch("corpus");
  auto solo = world()->split(world()->rank(), 0);
  if (world()->rank() == 0) generate_corpus(out, solo);
  world()->barrier();
  check_corpus(out);
  world()->barrier();
}

TEST_CASE("every flipped bit of a manifest and of its shard files is refused by verify and load alike",
          "[checkpoint][corpus][flips]") {
  // Verify, offline on rank 0, sees every bit of every byte flipped. Load, collective, sees one
  // flipped bit of every shard-file byte and of every 8th manifest byte (the manifest is read
  // alike by every rank, the shard files are spread over them): each in its own directory,
  // made by rank 0 up front, so that the ranks only meet inside load.
  const std::string base = std::string(SHARDOPT_TEST_CORPUS) + "/base-adam";
  const std::string dir = scratch("flips");
  const std::vector<std::string> names = {"manifest.json", shard_files(base).at(0), shard_files(base).at(1)};
  struct Flip {
    std::size_t file;
    std::size_t at;
    int bit;
  };
  std::vector<Flip> through_load;
  for (std::size_t f = 0; f < names.size(); ++f) {
    const std::size_t size = fs::file_size(base + "/" + names[f]);
    for (std::size_t at = 0; at < size; at += f == 0 ? 8 : 1) through_load.push_back({f, at, static_cast<int>(at % 8)});
  }
  auto needle = [&](std::size_t f) { return f == 0 ? std::string("manifest.json' is corrupt") : std::string("is corrupt: CRC32C"); };
  std::vector<std::string> originals;
  for (const std::string& name : names) originals.push_back(file_bytes(base + "/" + name));
  auto flip = [&](const std::string& path, std::size_t f, std::size_t at, int bit) {
    poke_byte(path, at, static_cast<char>(originals[f][at] ^ (1 << bit)));
  };

  if (world()->rank() == 0) {
    int64_t flips = 0, refused = 0;
    fs::copy(base, dir + "/verify", fs::copy_options::recursive);
    for (std::size_t f = 0; f < names.size(); ++f) {
      const std::string path = dir + "/verify/" + names[f];
      for (std::size_t at = 0; at < originals[f].size(); ++at) {
        for (int bit = 0; bit < 8; ++bit) {
          flip(path, f, at, bit);
          const Outcome v = outcome_of([&] { verify_checkpoint(dir + "/verify"); });
          CAPTURE(names[f], at, bit, v.message);
          CHECK(!v.ok);
          CHECK(v.code == ErrorCode::corrupt);
          CHECK(v.message.find(names[f]) != std::string::npos);
          CHECK(v.message.find(needle(f)) != std::string::npos);
          ++flips;
          refused += v.ok ? 0 : 1;
        }
        poke_byte(path, at, originals[f][at]);
      }
    }
    verify_checkpoint(dir + "/verify");  // restored, it verifies again
    REQUIRE(refused == flips);
    WARN("single-bit flips refused by verify: " << refused << " of " << flips);
    for (std::size_t k = 0; k < through_load.size(); ++k) {
      const std::string copy = dir + "/load" + std::to_string(k);
      fs::copy(base, copy, fs::copy_options::recursive);
      const Flip& x = through_load[k];
      flip(copy + "/" + names[x.file], x.file, x.at, x.bit);
    }
  }
  world()->barrier();
  Model model(corpus_sizes(), 5);
  auto opt = make_corpus_optimizer(world(), "adam", model);
  const std::vector<float> before = all_params(*opt);
  int64_t refused = 0;
  for (std::size_t k = 0; k < through_load.size(); ++k) {
    const Flip& x = through_load[k];
    const Outcome l = outcome_of([&] { opt->load(dir + "/load" + std::to_string(k)); });
    CAPTURE(names[x.file], x.at, x.bit, l.message);
    CHECK(!l.ok);
    CHECK(l.code == ErrorCode::corrupt);
    CHECK(l.message.find(names[x.file]) != std::string::npos);
    CHECK(l.message.find(needle(x.file)) != std::string::npos);
    refused += l.ok ? 0 : 1;
  }
  REQUIRE(bitwise_equal(all_params(*opt), before));
  REQUIRE(refused == static_cast<int64_t>(through_load.size()));
  if (world()->rank() == 0) WARN("single-bit flips refused by load: " << refused << " of " << through_load.size());
  world()->barrier();
}

TEST_CASE("a version-1 manifest is refused until shardopt-ckpt upgrade has checked its files and rewritten it",
          "[checkpoint][corpus][upgrade]") {
  const std::string dir = scratch("upgrade");
  const std::string v1 = std::string(SHARDOPT_TEST_CORPUS) + "/mutants/manifest-version-1";
  if (world()->rank() == 0) {
    const std::string tool = SHARDOPT_CKPT_TOOL;
    auto run = [&](const std::string& args) {
      return std::system((tool + " " + args + " > " + dir + "/out.txt 2>&1").c_str());
    };
    fs::copy(v1, dir + "/good", fs::copy_options::recursive);
    fs::copy(v1, dir + "/damaged", fs::copy_options::recursive);
    const std::string victim = dir + "/damaged/" + shard_files(dir + "/damaged").at(1);
    poke_byte(victim, fs::file_size(victim) - 1, static_cast<char>(file_bytes(victim).back() ^ 0x10));
    const std::string manifest_v1 = file_bytes(dir + "/damaged/manifest.json");

    REQUIRE(run("verify " + dir + "/good") != 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("format version 1, which carries no checksum") != std::string::npos);
    // A shard file that does not match the old manifest: nothing is vouched for or rewritten.
    REQUIRE(run("upgrade " + dir + "/damaged") != 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("is corrupt: CRC32C") != std::string::npos);
    REQUIRE(file_bytes(dir + "/damaged/manifest.json") == manifest_v1);
    REQUIRE(run("upgrade " + dir + "/good") == 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("upgraded to the current format version") != std::string::npos);
    REQUIRE(run("verify " + dir + "/good") == 0);
    REQUIRE(run("upgrade " + dir + "/good") == 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("already current, OK") != std::string::npos);
    REQUIRE(read_checkpoint_info(dir + "/good").format_version == 2);
  }
  world()->barrier();
  Model model(corpus_sizes(), 3);
  auto opt = make_corpus_optimizer(world(), "adam", model);
  opt->load(dir + "/good");
  const auto [values, steps] = saved_state(std::string(SHARDOPT_TEST_CORPUS) + "/base-adam");
  REQUIRE(bitwise_equal(all_params(*opt), values));
  REQUIRE(all_steps(*opt) == steps);
  world()->barrier();
}

// Not run by CTest: regenerates the checked-in corpus (tests/checkpoint/corpus/README.md).
TEST_CASE("generate the corpus into $SHARDOPT_CORPUS_OUT", "[.generate_corpus]") {
  const char* out = std::getenv("SHARDOPT_CORPUS_OUT");
  REQUIRE(out != nullptr);
  REQUIRE(world()->size() == 1);
  generate_corpus(out, world());
}
