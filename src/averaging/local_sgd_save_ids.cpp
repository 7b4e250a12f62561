// src/averaging/local_sgd_save_ids.cpp — the names of local-SGD saves, and the removal of older ones (see local_sgd_save_ids.hpp).
#include "averaging/local_sgd_save_ids.hpp"

#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "checkpoint/file_io.hpp"

namespace shardopt {
namespace averaging {

std::string local_sgd_save_id(uint64_t generation, uint32_t token) {
  return fmt::format("ls{:06d}-{:08x}", generation, token);
}

bool is_local_sgd_save_id(const std::string& name) {
  constexpr std::size_t kTokenDigits = 8;
  constexpr std::size_t kLeast = 2 + 6 + 1 + kTokenDigits;
  // A uint64 generation has at most 20 digits.
  if (name.size() < kLeast || name.size() > kLeast + 14 || name.compare(0, 2, "ls") != 0) return false;
  const std::size_t dash = name.size() - kTokenDigits - 1;
  if (name[dash] != '-') return false;
  for (std::size_t i = 2; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  for (std::size_t i = dash + 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void remove_older_saves(const std::string& dir, const std::string& keep) {
  for (const std::string& entry : checkpoint::list_directory(dir)) {
    if (entry == keep || !is_local_sgd_save_id(entry)) continue;
    std::error_code ignored;
    std::filesystem::remove_all(checkpoint::join_path(dir, entry), ignored);
  }
}

}  // namespace averaging
}  // namespace shardopt
