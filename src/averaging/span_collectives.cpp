// src/averaging/span_collectives.cpp — bucketed all-reduces over lists of host spans.
#include "averaging/span_collectives.hpp"

#include <algorithm>
#include <cstring>

#include "comm/raw_collectives.hpp"

namespace shardopt {
namespace averaging {

namespace {

std::vector<HostSpan> merge_adjacent(std::vector<HostSpan> spans, std::size_t element_bytes) {
  std::vector<HostSpan> merged;
  for (const HostSpan& s : spans) {
    if (s.count == 0) continue;
    if (!merged.empty()) {
      HostSpan& last = merged.back();
      if (static_cast<char*>(last.data) + static_cast<std::size_t>(last.count) * element_bytes == s.data) {
        last.count += s.count;
        continue;
      }
    }
    merged.push_back(s);
  }
  return merged;
}

}  // namespace

int64_t all_reduce_spans(Communicator& comm, std::vector<HostSpan> spans, DType dtype, int64_t bucket_elements,
                         ReduceOp op, const std::function<void(void*, int64_t)>& prepare) {
  if (comm.size() <= 1) return 0;
  const std::size_t esize = dtype_size(dtype);
  spans = merge_adjacent(std::move(spans), esize);
  std::vector<char> staging;
  int64_t handed = 0;
  std::size_t at = 0;     // span
  int64_t offset = 0;     // element within it
  struct Piece {
    char* data;
    int64_t count;
  };
  std::vector<Piece> pieces;
  while (at < spans.size()) {
    pieces.clear();
    int64_t filled = 0;
    while (at < spans.size() && filled < bucket_elements) {
      const HostSpan& s = spans[at];
      const int64_t take = std::min(bucket_elements - filled, s.count - offset);
      pieces.push_back(Piece{static_cast<char*>(s.data) + static_cast<std::size_t>(offset) * esize, take});
      filled += take;
      offset += take;
      if (offset == s.count) {
        ++at;
        offset = 0;
      }
    }
    char* bucket = pieces[0].data;
    if (pieces.size() > 1) {
      staging.resize(static_cast<std::size_t>(filled) * esize);
      bucket = staging.data();
      std::size_t pos = 0;
      for (const Piece& p : pieces) {
        std::memcpy(bucket + pos, p.data, static_cast<std::size_t>(p.count) * esize);
        pos += static_cast<std::size_t>(p.count) * esize;
      }
    }
    if (prepare) prepare(bucket, filled);
    // On failure the staging goes to the abandoned-memory registry: the all-reduce may still
    // write it. (A span reduced in place is the caller's to keep.)
    comm::run_keeping_on_failure(staging, [&] { comm.all_reduce(bucket, filled, dtype, op); });
    handed += filled * static_cast<int64_t>(esize);
    if (pieces.size() > 1) {
      std::size_t pos = 0;
      for (const Piece& p : pieces) {
        std::memcpy(p.data, bucket + pos, static_cast<std::size_t>(p.count) * esize);
        pos += static_cast<std::size_t>(p.count) * esize;
      }
    }
  }
  return handed;
}

}  // namespace averaging
}  // namespace shardopt
