// bench/src/cache.cpp — finds the last-level cache's size and how many of them a process and the machine have, from sysfs (sysconf only as a fallback).
#include "cache.hpp"

#include <algorithm>
#include <cctype>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sched.h>
#include <unistd.h>

namespace shardopt_bench {
namespace {

bool read_line(const std::string& path, std::string& out) {
  std::ifstream in(path);
  if (!in || !std::getline(in, out)) return false;
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back())) != 0) out.pop_back();
  return true;
}

// "32768K", "1M", "512": sysfs writes sizes in KiB with a K suffix.
int64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string suffix = text.substr(used);
  if (suffix.empty()) return value;
  if (suffix == "K") return value << 10;
  if (suffix == "M") return value << 20;
  if (suffix == "G") return value << 30;
  return 0;
}

struct CacheEntry {
  int level = 0;
  int64_t bytes = 0;
  std::string shared;  // shared_cpu_list: which CPUs share this cache instance
};

// The highest-level data or unified cache of one CPU (level 0 if none could be read).
CacheEntry last_level_of(const std::string& cpu_root, int cpu) {
  CacheEntry best;
  const std::string dir = cpu_root + "/cpu" + std::to_string(cpu) + "/cache";
  for (int index = 0; index < 16; ++index) {
    const std::string base = dir + "/index" + std::to_string(index) + "/";
    std::string level, type, size, shared;
    if (!read_line(base + "level", level)) continue;
    if (read_line(base + "type", type) && type == "Instruction") continue;
    if (!read_line(base + "size", size)) continue;
    CacheEntry e;
    try {
      e.level = std::stoi(level);
    } catch (const std::exception&) {
      continue;
    }
    e.bytes = parse_size(size);
    // Without shared_cpu_list the cache is taken as this CPU's own (more instances: larger arrays).
    e.shared = read_line(base + "shared_cpu_list", shared) ? shared : "cpu" + std::to_string(cpu);
    if (e.bytes > 0 && e.level > best.level) best = e;
  }
  return best;
}

// cpuN directories under cpu_root.
std::vector<int> all_cpus(const std::string& cpu_root) {
  std::vector<int> cpus;
  DIR* d = opendir(cpu_root.c_str());
  if (d == nullptr) return cpus;
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name.size() > 3 && name.compare(0, 3, "cpu") == 0 &&
        std::all_of(name.begin() + 3, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
      cpus.push_back(std::stoi(name.substr(3)));
    }
  }
  closedir(d);
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

int affinity_cpu_count() { return static_cast<int>(affinity_cpus().size()); }

CacheInfo last_level_cache_from_sysfs(const std::string& cpu_root, const std::vector<int>& cpus) {
  CacheInfo info;
  const std::vector<int> mine = cpus.empty() ? std::vector<int>{0} : cpus;
  // The largest last-level cache among this process's CPUs sets the level and size (with
  // heterogeneous cores: the larger one, so arrays only grow); each distinct instance counts.
  std::set<std::string> reach;
  for (int cpu : mine) {
    const CacheEntry e = last_level_of(cpu_root, cpu);
    if (e.level == 0) continue;
    if (info.level == 0 || e.level > info.level || (e.level == info.level && e.bytes > info.instance_bytes)) {
      info.level = e.level;
      info.instance_bytes = e.bytes;
    }
    reach.insert(e.shared);
  }
  if (info.level == 0) return CacheInfo{};
  std::set<std::string> node;
  for (int cpu : all_cpus(cpu_root)) {
    const CacheEntry e = last_level_of(cpu_root, cpu);
    if (e.level != 0) node.insert(e.shared);
  }
  info.reach_instances = static_cast<int>(reach.size());
  info.node_instances = static_cast<int>(std::max(node.size(), reach.size()));
  info.source = "sysfs";
  return info;
}

CacheInfo last_level_cache() {
  long bytes = 0;
  int level = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  level = 3;
  if (bytes <= 0) {
    bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
    level = 2;
  }
#endif
  const int64_t claimed = bytes > 0 ? static_cast<int64_t>(bytes) : 0;
  CacheInfo info = last_level_cache_from_sysfs("/sys/devices/system/cpu", affinity_cpus());
  info.sysconf_bytes = claimed;
  if (info.level != 0) return info;
  info.reach_instances = info.node_instances = 1;
  if (claimed > 0) {
    info.level = level;
    info.instance_bytes = claimed;
    info.source = "sysconf";
  } else {
    info.level = 3;
    info.instance_bytes = int64_t{32} << 20;
    info.source = "default";
  }
  return info;
}

int64_t stream_array_bytes(const CacheInfo& llc) {
  return std::max<int64_t>(4 * llc.reach_bytes(), int64_t{64} << 20);
}

}  // namespace shardopt_bench
