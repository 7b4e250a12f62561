// src/core/error.cpp — names of error codes.
#include "shardopt/error.hpp"

namespace shardopt {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::mismatch: return "mismatch";
    case ErrorCode::comm: return "comm";
    case ErrorCode::io: return "io";
    case ErrorCode::corrupt: return "corrupt";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::cuda: return "cuda";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::internal: return "internal";
    case ErrorCode::out_of_memory: return "out_of_memory";
  }
  return "unknown";
}

}  // namespace shardopt
