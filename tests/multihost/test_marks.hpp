// tests/multihost/test_marks.hpp — named points a test program reports reaching, so a harness can kill a rank or cut a link there (the library itself has no such hooks).
#pragma once

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

namespace shardopt_multihost {

// At each named point, with SHARDOPT_TEST_MARK_DIR set, writes DIR/POINT.rankR holding this
// process's PID (written under another name first and renamed, so a watcher never reads half
// a file): harness.sh's mh_kill_when_marked and mh_cut_link_when_marked wait for it. With
// SHARDOPT_TEST_KILL_AT=POINT:R the process then SIGKILLs itself on rank R, exactly there.
inline void reached(const std::string& point, int rank) {
  const std::string tag = point + ".rank" + std::to_string(rank);
  if (const char* dir = std::getenv("SHARDOPT_TEST_MARK_DIR"); dir != nullptr && *dir != '\0') {
    const std::string path = std::string(dir) + "/" + tag;
    const std::string partial = path + ".partial";
    if (std::FILE* f = std::fopen(partial.c_str(), "w")) {
      std::fprintf(f, "%ld\n", static_cast<long>(getpid()));
      std::fclose(f);
      std::rename(partial.c_str(), path.c_str());
    }
  }
  if (const char* kill_at = std::getenv("SHARDOPT_TEST_KILL_AT"); kill_at != nullptr && point + ":" + std::to_string(rank) == kill_at) {
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
}

}  // namespace shardopt_multihost
