// src/comm/node_shared_memory.cpp — creating, mapping and naming a node-shared host buffer (see node_shared_memory.hpp).
#include "comm/node_shared_memory.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "comm/raw_collectives.hpp"

namespace shardopt {
namespace comm {
namespace {

// What the creating rank tells the others, and what every rank reports back.
struct Status {
  int32_t ok = 0;
  int32_t error = 0;  // errno of the failing call
  char call[24] = {};
  char name[64] = {};
};

void fail(Status& status, const char* call) {
  status.ok = 0;
  status.error = errno;
  std::snprintf(status.call, sizeof status.call, "%s", call);
}

std::string unique_name() {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return fmt::format("/shardopt-{}-{}-{:x}", static_cast<long>(getpid()), counter.fetch_add(1), static_cast<uint64_t>(now));
}

// Maps the open descriptor `fd` of `bytes`; closes it either way.
void* map_descriptor(int fd, std::size_t bytes, Status& status) {
  // MAP_POPULATE: the page tables are filled now, not by faults inside the first step.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    fail(status, "mmap");
    p = nullptr;
  }
  close(fd);
  return p;
}

// The name of the segment this rank created, removed when it goes out of scope: once every rank
// of the node has opened the segment, or when the exchange throws first (a timeout, a poisoned
// communicator), so that a construction that fails never leaves the segment in /dev/shm.
class CreatedName {
 public:
  CreatedName() = default;
  CreatedName(const CreatedName&) = delete;
  CreatedName& operator=(const CreatedName&) = delete;
  ~CreatedName() { remove(); }
  void adopt(const std::string& name) { name_ = name; }
  void remove() noexcept {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

void* create(const std::string& name, std::size_t bytes, Status& status, CreatedName& created) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    fail(status, "shm_open");
    return nullptr;
  }
  created.adopt(name);  // ours from here on (O_EXCL): removed on every way out
  // posix_fallocate returns its error rather than setting errno.
  const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (reserved != 0) {
    errno = reserved;
    fail(status, "posix_fallocate");
    close(fd);
    return nullptr;
  }
  return map_descriptor(fd, bytes, status);
}

void* open_existing(const char* name, std::size_t bytes, Status& status) {
  const int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) {
    fail(status, "shm_open");
    return nullptr;
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) != bytes) {
    fail(status, "fstat");
    close(fd);
    return nullptr;
  }
  return map_descriptor(fd, bytes, status);
}

}  // namespace

NodeSharedBuffer map_node_shared(Communicator& node, std::size_t bytes, std::string& why_not) {
  Status mine;
  mine.ok = 1;
  // If the exchange below throws, both go: the mapping, then the name (node rank 0's).
  CreatedName name_of_created;
  void* data = nullptr;
  std::shared_ptr<void> mapping;  // unmaps on every way out but the one that hands it over
  if (node.rank() == 0) {
    const std::string name = unique_name();
    std::snprintf(mine.name, sizeof mine.name, "%s", name.c_str());
    data = create(name, bytes, mine, name_of_created);
  }
  Status created = mine;
  if (data != nullptr) mapping = std::shared_ptr<void>(data, [bytes](void* p) { munmap(p, bytes); });
  broadcast_record(node, created, 0);
  if (node.rank() != 0) {
    if (created.ok) {
      data = open_existing(created.name, bytes, mine);
      if (data != nullptr) mapping = std::shared_ptr<void>(data, [bytes](void* p) { munmap(p, bytes); });
    } else {
      mine.ok = 0;  // the creator's failure, reported below under its rank
    }
  }
  const std::vector<Status> all = all_gather_records(node, mine);
  // Every rank has mapped it (or given up): the name is no longer needed.
  name_of_created.remove();
  bool all_mapped = true;
  std::size_t culprit = 0;  // the first rank whose own call failed (others may only have given up)
  for (std::size_t r = all.size(); r-- > 0;) {
    all_mapped = all_mapped && all[r].ok != 0;
    if (!all[r].ok && all[r].call[0] != '\0') culprit = r;
  }
  if (!all_mapped) {
    const Status& s = all[culprit];
    why_not = fmt::format("node rank {} could not map {} bytes of shared memory: {} failed: {}", culprit, bytes,
                          s.call, std::strerror(s.error));
    return {};
  }
  NodeSharedBuffer buffer;
  buffer.data = data;
  buffer.bytes = bytes;
  buffer.mapping = std::move(mapping);
  return buffer;
}

}  // namespace comm
}  // namespace shardopt
