// kernels/kernel_check.hpp — SHARDOPT_KERNEL_CHECK and kernels::raise_error: the kernels' argument checks, throwing shardopt::Error.
//
// kernels/ is a leaf library and may not use src/core/check.hpp, so it has this small
// counterpart of its own, built only on the public Error type and fmt. The names differ from
// core's (raise, SHARDOPT_CHECK) so that a file seeing both headers has no clash or ambiguity.
// Host code only: nvcc-compiled kernel files never throw.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "shardopt/error.hpp"

namespace shardopt {
namespace kernels {

template <typename... Args>
[[noreturn]] void raise_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kernels
}  // namespace shardopt

// SHARDOPT_KERNEL_CHECK(cond, code, "format {}", args...): throws Error(code, message) when !cond.
#define SHARDOPT_KERNEL_CHECK(cond, code, ...)                                              \
  do {                                                                                      \
    if (!(cond)) ::shardopt::kernels::raise_error(::shardopt::ErrorCode::code, __VA_ARGS__); \
  } while (0)
