// tests/fuzz/fuzz_support.cpp — scratch directories, file writes and manifest re-sealing for the fuzz harnesses.
#include "fuzz_support.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "checkpoint/sealed_json.hpp"

namespace shardopt_fuzz {

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/shardopt-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::perror("shardopt fuzz: mkdtemp");
      std::abort();
    }
    return templ;
  }();
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(("shardopt fuzz: writing " + path).c_str());
    std::abort();
  }
}

void clear_dir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
  }
  closedir(d);
}

void reseal_manifest(std::string& text) {
  const auto seal = shardopt::checkpoint::find_seal(text, "manifest_crc32c");
  if (!seal) return;
  const std::string digits = fmt::format("{:08x}", shardopt::checkpoint::seal_of(text, seal->first));
  text.replace(seal->first, digits.size(), digits);
}

}  // namespace shardopt_fuzz
