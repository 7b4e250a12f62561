// bench/src/cache.hpp — the last-level cache that the bandwidth arrays must dwarf and that decides whether a step is DRAM-bound, read from sysfs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardopt_bench {

// Why sysfs: glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) comes from CPUID, which in a virtual
// machine can describe the host's whole package (256-320 MiB on the VMs this bench ran on)
// instead of the 32 MiB last-level cache the guest's cores actually share.
struct CacheInfo {
  int level = 0;                // 3 for an L3; 0 when nothing was read
  int64_t instance_bytes = 0;   // one last-level cache
  int reach_instances = 0;      // distinct last-level caches this process's CPUs use
  int node_instances = 0;       // distinct last-level caches on the machine
  std::string source;           // "sysfs", "sysconf" or "default"
  // glibc's figure (0 if none): in a virtual machine often the host package's whole L3, which
  // the guest's cores may still hit as they move between the host's cores.
  int64_t sysconf_bytes = 0;

  // What one process can hold in the last-level cache (its affinity mask's caches) and what the
  // whole machine can.
  int64_t reach_bytes() const { return instance_bytes * reach_instances; }
  int64_t node_bytes() const { return instance_bytes * node_instances; }
  // The most cache any source claims for the machine: what a step's data must overflow before
  // its time can be held to a DRAM roofline.
  int64_t largest_claim_bytes() const { return node_bytes() > sysconf_bytes ? node_bytes() : sysconf_bytes; }
};

// Reads <cpu_root>/cpuN/cache/indexK/{level,type,size,shared_cpu_list} (instruction caches
// left out; the highest level is the last level). `cpus`: the CPUs this process may run on
// (empty: cpu0). Returns level 0 when the tree is absent or unreadable.
CacheInfo last_level_cache_from_sysfs(const std::string& cpu_root, const std::vector<int>& cpus);

// CPUs in this process's affinity mask (0 when it cannot be read).
int affinity_cpu_count();

// This process's view: sysfs under /sys/devices/system/cpu with its sched_getaffinity mask;
// else sysconf's largest cache level (one instance, possibly overstated: only ever larger
// arrays follow from it); else 32 MiB. sysconf_bytes is filled in every case.
CacheInfo last_level_cache();

// Bytes per bandwidth-test array per rank: 4 x what this rank's CPUs can cache, and at least
// 64 MiB, so that neither one rank's arrays nor (with ranks sharing a cache) all of them fit.
int64_t stream_array_bytes(const CacheInfo& llc);

}  // namespace shardopt_bench
