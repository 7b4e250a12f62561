// src/comm/mpi/peer_liveness.cpp — gathers each rank's host and process id, and names the peers of this host that no longer run.
#include "comm/mpi/peer_liveness.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace shardopt {
namespace comm {
namespace {

constexpr std::size_t kHostBytes = 64;

struct PeerWire {
  int32_t pid = 0;
  char host[kHostBytes] = {};
};

std::string this_host() {
  char name[kHostBytes + 1] = {};
  if (gethostname(name, kHostBytes) != 0) return "";
  return std::string(name, strnlen(name, kHostBytes));
}

// False once the process has exited: absent, or a zombie its parent has not reaped yet.
bool still_running(int pid) {
  if (pid <= 0) return true;  // unknown: do not accuse
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // The state follows the command name, which is in parentheses and may hold spaces.
  const std::size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

}  // namespace

int PeerDirectory::gather(MPI_Comm comm, int rank) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  PeerWire mine;
  mine.pid = static_cast<int32_t>(getpid());
  const std::string host = this_host();
  std::memcpy(mine.host, host.data(), host.size());
  std::vector<PeerWire> all(static_cast<std::size_t>(size));
  const int code = MPI_Allgather(&mine, sizeof(PeerWire), MPI_BYTE, all.data(), sizeof(PeerWire), MPI_BYTE, comm);
  if (code != MPI_SUCCESS) return code;
  rank_ = rank;
  peers_.clear();
  for (const PeerWire& w : all) peers_.push_back(Peer{w.pid, std::string(w.host, strnlen(w.host, kHostBytes))});
  return MPI_SUCCESS;
}

std::string PeerDirectory::describe_missing() const {
  if (peers_.empty()) return "";
  const std::string& host = peers_[static_cast<std::size_t>(rank_)].host;
  std::string text;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    const Peer& p = peers_[r];
    if (static_cast<int>(r) == rank_ || p.host != host || still_running(p.pid)) continue;
    text += fmt::format("; rank {} (pid {} on host {}) is no longer running", r, p.pid, p.host);
  }
  return text;
}

}  // namespace comm
}  // namespace shardopt
