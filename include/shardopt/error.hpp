// shardopt/error.hpp — the one exception type shardopt throws, with a machine-readable code.
#pragma once

#include <stdexcept>
#include <string>

#include "shardopt/export.hpp"

namespace shardopt {

enum class ErrorCode : int {
  invalid_argument = 1,
  mismatch = 2,      // ranks disagree (registration, sizes, collective arguments)
  comm = 3,          // a collective failed
  io = 4,
  corrupt = 5,
  unsupported = 6,
  cuda = 7,
  timeout = 8,       // a collective did not finish in time (dead or diverged peer)
  internal = 9,
  out_of_memory = 10,  // an allocation failed (the message names what and how many bytes)
};
SHARDOPT_API const char* error_code_name(ErrorCode code);

class SHARDOPT_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace shardopt
