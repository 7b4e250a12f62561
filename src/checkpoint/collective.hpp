// src/checkpoint/collective.hpp — the phases of a save or load end in the ranks' agreement: every rank fails together, with one message, when any rank failed.
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

// Collective, through comm::agree under `operation` ("save", "load"): if any rank failed, every
// rank raises that failure's code (its message prefixed by `what`, and naming the rank on the
// others). Otherwise returns every rank's outcome.
std::vector<Outcome> agree_on_outcomes(Communicator& comm, const Outcome& mine, const std::string& operation,
                                       const std::string& what);

// Collective: rank `root`'s bytes reach every rank (the string is at most 255 bytes).
std::string broadcast_string(Communicator& comm, const std::string& text, int root);

}  // namespace checkpoint
}  // namespace shardopt
