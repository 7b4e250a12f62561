// tests/mpi/shm_segments.hpp — the node-shared memory segments this job's processes have in /dev/shm, to see that none is left behind.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

namespace shardopt_test {

// shardopt names its segments /shardopt-<pid>-...: those of every rank of the world (collective
// over world()), not of other jobs on the machine. Every rank sees the same moment: before
// its peers' next segment.
inline std::set<std::string> segments_of_this_job() {
  int32_t pid = static_cast<int32_t>(getpid());
  std::vector<int32_t> pids(static_cast<std::size_t>(world()->size()));
  world()->all_gather(&pid, pids.data(), sizeof pid, shardopt::DType::byte);
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    for (int32_t p : pids) {
      if (name.rfind("shardopt-" + std::to_string(p) + "-", 0) == 0) names.insert(name);
    }
  }
  world()->barrier();  // no rank creates the next segment before every rank has looked
  return names;
}

}  // namespace shardopt_test
