// tests/bench_smoke/test_bench_roofline.cpp — shardopt-bench's last-level cache reader on fake sysfs trees, its array sizing, and the verdict on a roofline fraction.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache.hpp"
#include "roofline.hpp"

namespace fs = std::filesystem;
using namespace shardopt_bench;

namespace {

// A fake /sys/devices/system/cpu: one directory per CPU, its caches as sysfs writes them.
struct FakeSysfs {
  fs::path root;
  explicit FakeSysfs(const std::string& name) : root(fs::temp_directory_path() / ("shardopt_bench_sysfs_" + name)) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~FakeSysfs() { fs::remove_all(root); }
  void cache(int cpu, int index, int level, const std::string& type, const std::string& size, const std::string& shared) {
    const fs::path dir = root / ("cpu" + std::to_string(cpu)) / "cache" / ("index" + std::to_string(index));
    fs::create_directories(dir);
    std::ofstream(dir / "level") << level << "\n";
    std::ofstream(dir / "type") << type << "\n";
    std::ofstream(dir / "size") << size << "\n";
    std::ofstream(dir / "shared_cpu_list") << shared << "\n";
  }
  // L1d, L1i, L2 of its own and an L3 shared as `l3_shared` says.
  void cpu(int cpu, const std::string& l3_size, const std::string& l3_shared) {
    cache(cpu, 0, 1, "Data", "32K", std::to_string(cpu));
    cache(cpu, 1, 1, "Instruction", "32K", std::to_string(cpu));
    cache(cpu, 2, 2, "Unified", "512K", std::to_string(cpu));
    cache(cpu, 3, 3, "Unified", l3_size, l3_shared);
  }
};

constexpr int64_t MiB = int64_t{1} << 20;

}  // namespace

TEST_CASE("the last-level cache is the highest level, read from sysfs, instances counted") {
  FakeSysfs sys("two_ccx");
  // 4 CPUs, two L3s of 32 MiB (CPUs 0-1 and 2-3), as a two-CCX part.
  for (int c = 0; c < 4; ++c) sys.cpu(c, "32768K", c < 2 ? "0-1" : "2-3");

  const CacheInfo one = last_level_cache_from_sysfs(sys.root.string(), {0});
  CHECK(one.level == 3);
  CHECK(one.instance_bytes == 32 * MiB);
  CHECK(one.reach_instances == 1);
  CHECK(one.node_instances == 2);
  CHECK(one.source == "sysfs");
  CHECK(one.reach_bytes() == 32 * MiB);
  CHECK(one.node_bytes() == 64 * MiB);

  // A process allowed on CPUs of both L3s can use both.
  const CacheInfo both = last_level_cache_from_sysfs(sys.root.string(), {1, 2});
  CHECK(both.reach_instances == 2);
  CHECK(both.reach_bytes() == 64 * MiB);
  // Two CPUs of the same L3: one instance.
  CHECK(last_level_cache_from_sysfs(sys.root.string(), {2, 3}).reach_instances == 1);
}

TEST_CASE("an instruction cache is never the last level, and sizes take K/M suffixes") {
  FakeSysfs sys("odd");
  sys.cache(0, 0, 1, "Data", "48K", "0");
  sys.cache(0, 1, 2, "Unified", "2M", "0");
  sys.cache(0, 2, 3, "Instruction", "64M", "0");  // not a real part: must be ignored
  const CacheInfo info = last_level_cache_from_sysfs(sys.root.string(), {});
  CHECK(info.level == 2);
  CHECK(info.instance_bytes == 2 * MiB);
}

TEST_CASE("no sysfs tree gives level 0, and the array size has its floor") {
  const CacheInfo none = last_level_cache_from_sysfs("/nonexistent/shardopt/cpu", {0});
  CHECK(none.level == 0);
  CacheInfo small;
  small.instance_bytes = 8 * MiB;
  small.reach_instances = small.node_instances = 1;
  CHECK(stream_array_bytes(small) == 64 * MiB);  // at least 64 MiB per array
  CacheInfo big = small;
  big.instance_bytes = 32 * MiB;
  big.reach_instances = big.node_instances = 2;
  CHECK(stream_array_bytes(big) == 4 * 64 * MiB);  // 4 x what the rank's CPUs can cache
  big.sysconf_bytes = 256 * MiB;
  CHECK(big.largest_claim_bytes() == 256 * MiB);
  big.sysconf_bytes = 0;
  CHECK(big.largest_claim_bytes() == 64 * MiB);
}

TEST_CASE("the machine's own cache reader finds something") {
  const CacheInfo info = last_level_cache();
  CHECK(info.level >= 1);
  CHECK(info.instance_bytes > 0);
  CHECK(info.reach_instances >= 1);
  CHECK(info.node_instances >= info.reach_instances);
  CHECK(stream_array_bytes(info) >= 64 * MiB);
}

TEST_CASE("a fraction above 1.05 of a DRAM-bound step is a measurement error; cache-resident ones are not judged") {
  CHECK(judge_roofline(0.8, 1.0, false).status == RooflineStatus::ok);
  CHECK(judge_roofline(1.05, 1.0, false).status == RooflineStatus::ok);
  const RooflineVerdict over = judge_roofline(1.12, 1.0, false);
  CHECK(over.status == RooflineStatus::measurement_error);
  CHECK(format_fraction(over) == "1.120 (measurement error: above 1.05)");
  CHECK(std::string(status_name(over.status)) == "measurement_error");
  const RooflineVerdict cached = judge_roofline(3.0, 1.0, true);
  CHECK(cached.status == RooflineStatus::cache_resident);
  CHECK(format_fraction(cached).rfind("3.000 (cache-resident", 0) == 0);
  CHECK(format_fraction(judge_roofline(0.5, 1.0, false)) == "0.500");
  CHECK(judge_roofline(1.0, 0.0, false).fraction == 0.0);  // nothing measured: nothing claimed
}

TEST_CASE("bytes per updated element follow the rule and the dtype") {
  CHECK(update_bytes_per_param(UpdateShape::adam, shardopt::DType::f32) == 28);
  CHECK(update_bytes_per_param(UpdateShape::adam, shardopt::DType::bf16) == 28);
  CHECK(update_bytes_per_param(UpdateShape::sgd_momentum, shardopt::DType::f32) == 20);
  CHECK(update_bytes_per_param(UpdateShape::sgd, shardopt::DType::f16) == 12);
}
