// src/remote/staging.hpp — callers' buffers in CUDA device memory, read and written through host copies (requests travel, and owners keep their rows, in host memory).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace shardopt {
namespace remote {

// Whether `p` is CUDA device memory, which the host cannot read in place (managed memory, pinned
// and ordinary host memory can be). Always false in a build without CUDA, which cannot tell:
// there a device pointer is refused nowhere and faults on first read, as any bad pointer.
bool in_device_memory(const void* p);

// `bytes` at `p` as host memory: `p` itself where the host can read it, else a copy made now
// (cudaMemcpy; Error(cuda) naming `what` when it fails).
class HostView {
 public:
  HostView(const void* p, std::size_t bytes, const std::string& what);
  const void* data() const { return copy_.empty() ? p_ : copy_.data(); }
  bool copied() const { return !copy_.empty(); }

 private:
  const void* p_;
  std::vector<char> copy_;
};

// Copies `bytes` from host memory `src` to `dst`, host or CUDA device memory.
void copy_from_host(void* dst, const void* src, std::size_t bytes, const std::string& what);

}  // namespace remote
}  // namespace shardopt
