// src/remote/wire.cpp — the zero-copy send of a request: one hindexed datatype over the header and the caller's payload.
#include "remote/wire.hpp"

#include <climits>
#include <cstring>
#include <mutex>

#include "core/check.hpp"

namespace shardopt {
namespace remote {

int start_send(PendingSend& send, const std::vector<std::pair<const void*, std::size_t>>& spans, int dest,
               MPI_Comm comm, bool pack) {
  send.dest = dest;
  // Up to kPackedBytes, the header and payload are copied into one contiguous buffer (a few
  // microseconds for a typical push): no derived datatype is built per push, Open MPI can move a
  // contiguous message with a single copy by the receiver, and the caller's buffers are free
  // of MPI at once. Larger requests are sent from the caller's memory (hindexed, no copy).
  std::size_t total = sizeof(RequestHeader);
  for (const auto& span : spans) total += span.second;
  if (total <= kPackedBytes || pack) {
    SHARDOPT_CHECK(total <= static_cast<std::size_t>(INT_MAX), unsupported,
                   "RemoteOptimizer: one request carries {} bytes; over MPI a request carries at most {} (push in "
                   "smaller parts)",
                   total, INT_MAX);
    std::vector<char> packed(total);
    std::memcpy(packed.data(), &send.header, sizeof(RequestHeader));
    std::size_t at = sizeof(RequestHeader);
    for (const auto& span : spans) {
      if (span.second > 0) std::memcpy(packed.data() + at, span.first, span.second);
      at += span.second;
    }
    send.packed = std::move(packed);  // after the copy: a span may point into the old packed
    return MPI_Isend(send.packed.data(), static_cast<int>(total), MPI_BYTE, dest, kRequestTag, comm, &send.request);
  }
  std::vector<int> lengths;
  std::vector<MPI_Aint> places;
  MPI_Aint address = 0;
  MPI_Get_address(&send.header, &address);
  lengths.push_back(static_cast<int>(sizeof(RequestHeader)));
  places.push_back(address);
  for (const auto& span : spans) {
    if (span.second == 0) continue;
    SHARDOPT_CHECK(span.second <= static_cast<std::size_t>(INT_MAX), unsupported,
                   "RemoteOptimizer: one request carries {} bytes; over MPI a request carries at most {} (push in "
                   "smaller parts)",
                   span.second, INT_MAX);
    MPI_Get_address(span.first, &address);
    lengths.push_back(static_cast<int>(span.second));
    places.push_back(address);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int code = MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), places.data(), MPI_BYTE, &type);
  if (code != MPI_SUCCESS) return code;
  code = MPI_Type_commit(&type);
  if (code == MPI_SUCCESS) code = MPI_Isend(MPI_BOTTOM, 1, type, dest, kRequestTag, comm, &send.request);
  // Freeing a datatype that a pending send uses is allowed: MPI keeps it until the send ends.
  MPI_Type_free(&type);
  return code;
}

namespace {
struct Abandoned {
  std::mutex mutex;
  std::vector<std::vector<char>> buffers;
  std::vector<std::unique_ptr<PendingSend>> sends;
};
// Never destroyed: MPI may touch these until it is finalised at exit.
Abandoned& abandoned() {
  static Abandoned* held = new Abandoned;
  return *held;
}
}  // namespace

void abandon(std::vector<char> bytes) {
  std::lock_guard<std::mutex> lock(abandoned().mutex);
  abandoned().buffers.push_back(std::move(bytes));
}

void abandon(std::unique_ptr<PendingSend> send) {
  std::lock_guard<std::mutex> lock(abandoned().mutex);
  abandoned().sends.push_back(std::move(send));
}

}  // namespace remote
}  // namespace shardopt
