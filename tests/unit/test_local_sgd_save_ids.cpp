// tests/unit/test_local_sgd_save_ids.cpp — removing older local-SGD saves touches only entries named as shardopt names its saves, never a user's look-alike files.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "averaging/local_sgd_save_ids.hpp"

namespace fs = std::filesystem;
using shardopt::averaging::local_sgd_save_id;
using shardopt::averaging::remove_older_saves;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("shardopt-save-ids-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  void file(const std::string& name) const { std::ofstream(path / name) << "user data\n"; }
  void save(const std::string& name) const {
    fs::create_directories(path / name / "replica-0");
    std::ofstream(path / name / "replica-0" / "manifest.json") << "{}\n";
  }
  bool has(const std::string& name) const { return fs::exists(path / name); }
};

}  // namespace

TEST_CASE("local-SGD save ids: generation and token", "[averaging][local_sgd]") {
  CHECK(local_sgd_save_id(3, 0x0badf00du) == "ls000003-0badf00d");
  CHECK(local_sgd_save_id(1234567, 0xffffffffu) == "ls1234567-ffffffff");
}

TEST_CASE("local-SGD save ids are recognised exactly", "[averaging][local_sgd]") {
  using shardopt::averaging::is_local_sgd_save_id;
  CHECK(is_local_sgd_save_id(local_sgd_save_id(0, 0)));
  CHECK(is_local_sgd_save_id(local_sgd_save_id(UINT64_MAX, 0xffffffffu)));
  for (const char* name : {"ls00001-12345678", "ls000001-1234567", "ls000001-123456789", "ls000001-1234567F",
                           "ls000001_12345678", "lsx00001-12345678", "Ls000001-12345678", "ls000001-12345678 ",
                           "ls-12345678", "ls", "", "ls123456789012345678901-12345678", "local_sgd.json"}) {
    INFO(name);
    CHECK_FALSE(is_local_sgd_save_id(name));
  }
}

TEST_CASE("remove_older_saves removes older saves and keeps a user's look-alike entries", "[averaging][local_sgd]") {
  const TempDir dir;
  const std::string keep = local_sgd_save_id(3, 0x0badf00du);
  dir.save(keep);
  dir.save(local_sgd_save_id(2, 0x12345678u));  // the previous save
  dir.save(local_sgd_save_id(3, 0x00000001u));  // a save of this generation that never committed
  dir.file("local_sgd.json");
  // Start with "ls" and as long as the save id, but not shardopt's names.
  const std::vector<std::string> look_alikes = {"lsmy-run-notes.md", "ls000002-1234567G", "ls000002_12345678",
                                                "lsabcdef-12345678", "ls000002-1234567", "ls00000212345678x"};
  for (const std::string& name : look_alikes) dir.file(name);
  dir.save("ls-user-backups!");  // a user's directory
  dir.file("LS000002-12345678");
  remove_older_saves(dir.path.string(), keep);
  CHECK(dir.has(keep));
  CHECK(dir.has("local_sgd.json"));
  CHECK_FALSE(dir.has(local_sgd_save_id(2, 0x12345678u)));
  CHECK_FALSE(dir.has(local_sgd_save_id(3, 0x00000001u)));
  for (const std::string& name : look_alikes) {
    INFO(name);
    CHECK(dir.has(name));
  }
  CHECK(dir.has("ls-user-backups!"));
  CHECK(dir.has("LS000002-12345678"));
}

TEST_CASE("remove_older_saves past generation 999999: ids grow a digit, older ones still go", "[averaging][local_sgd]") {
  const TempDir dir;
  const std::string keep = local_sgd_save_id(1000000, 0x0000abcdu);
  dir.save(keep);
  dir.save(local_sgd_save_id(999999, 0x12345678u));
  dir.file("lsmy-run-notes0.md");  // as long as the new id
  remove_older_saves(dir.path.string(), keep);
  CHECK(dir.has(keep));
  CHECK_FALSE(dir.has(local_sgd_save_id(999999, 0x12345678u)));
  CHECK(dir.has("lsmy-run-notes0.md"));
}
