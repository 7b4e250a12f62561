// src/remote/wire.hpp — the remote optimizer's messages: request and reply headers, their tags, and the nonblocking sends that carry them without copying payloads.
//
// Every request is one MPI message on the optimizer's own duplicate communicator, tag
// kRequestTag: a RequestHeader followed by its payload (a dense gradient; row indices then
// rows; touched parameter ids), sent zero-copy from the caller's memory through an hindexed
// datatype. One message per request, so a trainer that dies mid-request leaves nothing half
// parsed. Messages from one trainer arrive in the order sent (MPI's non-overtaking rule on one
// tag), so a context's pushes reach an owner before its step. Replies go back on a tag of their
// own per request (reply_tag), so several steps in flight never take each other's answers.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace shardopt {
namespace remote {

constexpr int kRequestTag = 7;
constexpr int kReplyTagBase = 1000;
constexpr int64_t kReplyTagSpan = 1 << 14;  // every MPI allows tags up to 32767
inline int reply_tag(int64_t request_id) { return kReplyTagBase + static_cast<int>(request_id % kReplyTagSpan); }

enum class RequestKind : int32_t {
  push_dense = 1,  // payload: `count` floats for elements [offset, offset + count) of the param
  push_rows = 2,   // payload: `count` int64 global rows, then count * row_size floats
  step = 3,        // payload: `count` int32 ids of the params pushed into the context
  pull = 4,        // reply: elements [offset, offset + count) of the param
  pull_rows = 5,   // payload: `count` int64 global rows; reply: their rows
  finish = 6,      // the trainer is done; `sequence` = steps it issued
};

struct RequestHeader {
  RequestKind kind = RequestKind::push_dense;
  int32_t param = -1;
  int64_t context = -1;
  int64_t request_id = -1;  // replies' tag; pushes carry their ordinal for messages
  int64_t sequence = -1;    // step: this trainer's step number (0, 1, ...); finish: steps issued
  int64_t offset = 0;
  int64_t count = 0;
};

constexpr std::size_t kMessageBytes = 240;
struct ReplyHeader {
  int64_t request_id = -1;
  int32_t code = 0;  // 0: done; else an ErrorCode
  int32_t message_length = 0;
  char message[kMessageBytes] = {};
};

// One nonblocking send of a header and up to two payload spans, and what must outlive it.
struct PendingSend {
  MPI_Request request = MPI_REQUEST_NULL;
  RequestHeader header;
  int dest = -1;
  std::vector<char> packed;  // payload gathered from several places, or the whole packed request
};

constexpr std::size_t kPackedBytes = 1 << 20;  // requests up to this size are sent from one copy

// Starts `send` (its header, then `spans` of bytes in order) to `dest`; the PendingSend must
// stay where it is until the request completes. Returns MPI's code.
// `pack`: copy the payload whatever its size (the spans die when this returns: host copies of
// device memory).
int start_send(PendingSend& send, const std::vector<std::pair<const void*, std::size_t>>& spans, int dest,
               MPI_Comm comm, bool pack = false);

// Memory MPI may still write or read (a receive from, or a send to, a peer that never answered:
// MPI cannot cancel it safely) is handed here and kept until the process exits.
void abandon(std::vector<char> bytes);
void abandon(std::unique_ptr<PendingSend> send);

}  // namespace remote
}  // namespace shardopt
