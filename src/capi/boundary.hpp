// src/capi/boundary.hpp — what every extern "C" function does at the boundary: catch everything, map it to a status, keep the message per thread, check pointers, struct sizes and handles.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dlpack_import.hpp"
#include "shardopt/error.hpp"
#include "shardopt/shardopt.h"
#include "shardopt/shardopt.hpp"

// The handle types the C header declares opaquely. `magic` says which kind a live handle is;
// liveness itself comes from the registry (capi/boundary.cpp), so a destroyed or stray pointer
// is refused without being dereferenced.
struct shardopt_comm_s {
  uint64_t magic = 0;
  std::shared_ptr<shardopt::Communicator> comm;
};

struct shardopt_optimizer_s {
  uint64_t magic = 0;
  std::shared_ptr<shardopt::Communicator> comm;  // keeps it alive past shardopt_comm_destroy
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
  std::vector<shardopt::DlpackOwner> owned;      // DLPack tensors, deleted after opt
};

namespace shardopt {
namespace capi {

constexpr uint64_t kCommMagic = 0x73686172645f636dull;       // "shard_cm"
constexpr uint64_t kOptimizerMagic = 0x73686172645f6f70ull;  // "shard_op"

// A failure with a status that has no shardopt::ErrorCode (handles, NULL, struct sizes), or
// one whose status must survive a round trip through a collective.
class StatusError : public std::runtime_error {
 public:
  StatusError(shardopt_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  shardopt_status status() const noexcept { return status_; }

 private:
  shardopt_status status_;
};

template <typename... Args>
[[noreturn]] void fail(shardopt_status status, fmt::format_string<Args...> format, Args&&... args) {
  throw StatusError(status, fmt::format(format, std::forward<Args>(args)...));
}

shardopt_status status_from(ErrorCode code) noexcept;
ErrorCode error_code_from(shardopt_status status) noexcept;

// Records "<function>: <message>" as this thread's last error and returns `status`. Never throws.
shardopt_status record_failure(const char* function, shardopt_status status, const char* message) noexcept;
void clear_last_error() noexcept;

// Runs `body` and turns whatever it throws into a status with its message.
template <typename Body>
shardopt_status guard(const char* function, Body&& body) noexcept {
  try {
    body();
    clear_last_error();
    return SHARDOPT_OK;
  } catch (const StatusError& e) {
    return record_failure(function, e.status(), e.what());
  } catch (const Error& e) {
    return record_failure(function, status_from(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return record_failure(function, SHARDOPT_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return record_failure(function, SHARDOPT_ERR_INTERNAL, e.what());
  } catch (...) {
    return record_failure(function, SHARDOPT_ERR_INTERNAL, "an unknown exception");
  }
}

template <typename T>
void check_not_null(const T* pointer, const char* name) {
  if (pointer == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "{} is NULL", name);
}

// Structs carry the size their caller was compiled with; only sizes this library knows are
// read (today: exactly its own).
template <typename Struct>
void check_struct(const Struct* s, const char* name, const char* type_name) {
  check_not_null(s, name);
  if (s->struct_size != sizeof(Struct)) {
    fail(SHARDOPT_ERR_STRUCT_SIZE,
         "{}->struct_size is {}, but {} is {} bytes in this library ({}); set it to sizeof({}), "
         "e.g. with {}_init()",
         name, s->struct_size, type_name, sizeof(Struct),
         s->struct_size < sizeof(Struct) ? "too small" : "larger than any version it knows", type_name,
         type_name);
  }
}

// The handle registry: every live handle with its kind (its magic), so that checks never
// dereference a dead or foreign pointer. Returns 0 for a pointer that is not a live handle.
void register_handle(const void* handle, uint64_t magic);
void unregister_handle(const void* handle);
uint64_t live_handle_kind(const void* handle);

shardopt_comm_s& checked_comm(shardopt_comm_t comm, const char* name);
shardopt_optimizer_s& checked_optimizer(shardopt_optimizer_t opt, const char* name);

}  // namespace capi
}  // namespace shardopt
