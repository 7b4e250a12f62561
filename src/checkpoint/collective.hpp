// src/checkpoint/collective.hpp — making every rank fail together, with one message, when any rank failed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace checkpoint {

// One rank's outcome of a local phase: ok, or an error; plus two numbers to share.
struct Outcome {
  bool ok = true;
  ErrorCode code = ErrorCode::internal;
  std::string message;
  uint64_t value0 = 0;
  uint64_t value1 = 0;

  void fail(const Error& e) {
    ok = false;
    code = e.code();
    message = e.what();
  }
};

// Collective: all-gathers every rank's outcome (fixed-size records, so ranks that failed and
// ranks that did not issue the same collective). If any failed, throws on every rank the
// Error of the lowest failing rank, its message prefixed by `what`. Otherwise returns all.
std::vector<Outcome> agree_on_outcomes(Communicator& comm, const Outcome& mine, const std::string& what);

// Collective: rank `root`'s bytes reach every rank (the string is at most 255 bytes).
std::string broadcast_string(Communicator& comm, const std::string& text, int root);

}  // namespace checkpoint
}  // namespace shardopt
