// src/core/check.hpp — SHARDOPT_CHECK and the helpers that build shardopt::Error messages.
#pragma once

#include <fmt/format.h>

#include "shardopt/error.hpp"

namespace shardopt {

template <typename... Args>
[[noreturn]] void raise(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace shardopt

// SHARDOPT_CHECK(cond, code, "format {}", args...): throws Error(code, message) when !cond.
#define SHARDOPT_CHECK(cond, code, ...)                         \
  do {                                                          \
    if (!(cond)) ::shardopt::raise(::shardopt::ErrorCode::code, __VA_ARGS__); \
  } while (0)
