// src/capi/boundary.cpp — the thread-local last error, status mapping and the registry of live handles.
#include "capi/boundary.hpp"

#include <mutex>
#include <unordered_map>

namespace shardopt {
namespace capi {
namespace {

// Per thread, so concurrent callers never see each other's messages.
thread_local std::string t_last_error;
// Set when the message itself could not be stored (no memory): last_error() says so instead.
thread_local bool t_last_error_lost = false;

struct HandleRegistry {
  std::mutex mutex;
  std::unordered_map<const void*, uint64_t> live;
};

HandleRegistry& registry() {
  // Never destroyed: handles may still be released by static destructors of the caller.
  static HandleRegistry* instance = new HandleRegistry;
  return *instance;
}

const char* kind_name(uint64_t magic) {
  if (magic == kCommMagic) return "shardopt_comm_t";
  if (magic == kOptimizerMagic) return "shardopt_optimizer_t";
  if (magic == kModelAveragerMagic) return "shardopt_model_averager_t";
  if (magic == kPostLocalSgdMagic) return "shardopt_post_local_sgd_t";
  if (magic == kStateDictMagic) return "shardopt_state_dict_t";
  return "unknown handle";
}

// Guards the counts of shardopt_optimizer_s (users, retired); never destroyed, as the registry.
std::mutex& lifetime_mutex() {
  static std::mutex* instance = new std::mutex;
  return *instance;
}

// The optimizer first (it may still point into the tensors), then the producers' deleters, in
// registration order.
void free_optimizer(shardopt_optimizer_s* opt) noexcept {
  opt->opt.reset();
  for (shardopt::DlpackOwner& t : opt->owned) t.reset();
  delete opt;
}

}  // namespace

// The live handle `handle` of kind `magic`, or the reason it is not one.
void check_handle(const void* handle, uint64_t magic, const char* name) {
  if (handle == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "{} is NULL", name);
  const uint64_t kind = live_handle_kind(handle);
  if (kind == 0) {
    fail(SHARDOPT_ERR_BAD_HANDLE, "{} ({}) is not a live {}: it was destroyed, or never created", name,
         handle, kind_name(magic));
  }
  if (kind != magic) {
    fail(SHARDOPT_ERR_BAD_HANDLE, "{} is a {}, not a {}", name, kind_name(kind), kind_name(magic));
  }
}

shardopt_status status_from(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return SHARDOPT_ERR_INVALID_ARGUMENT;
    case ErrorCode::mismatch: return SHARDOPT_ERR_MISMATCH;
    case ErrorCode::comm: return SHARDOPT_ERR_COMM;
    case ErrorCode::io: return SHARDOPT_ERR_IO;
    case ErrorCode::corrupt: return SHARDOPT_ERR_CORRUPT;
    case ErrorCode::unsupported: return SHARDOPT_ERR_UNSUPPORTED;
    case ErrorCode::cuda: return SHARDOPT_ERR_CUDA;
    case ErrorCode::timeout: return SHARDOPT_ERR_TIMEOUT;
    case ErrorCode::internal: return SHARDOPT_ERR_INTERNAL;
    case ErrorCode::out_of_memory: return SHARDOPT_ERR_OUT_OF_MEMORY;
  }
  return SHARDOPT_ERR_INTERNAL;
}

ErrorCode error_code_from(shardopt_status status) noexcept {
  switch (status) {
    case SHARDOPT_ERR_MISMATCH: return ErrorCode::mismatch;
    case SHARDOPT_ERR_COMM: return ErrorCode::comm;
    case SHARDOPT_ERR_IO: return ErrorCode::io;
    case SHARDOPT_ERR_CORRUPT: return ErrorCode::corrupt;
    case SHARDOPT_ERR_UNSUPPORTED: return ErrorCode::unsupported;
    case SHARDOPT_ERR_CUDA: return ErrorCode::cuda;
    case SHARDOPT_ERR_TIMEOUT: return ErrorCode::timeout;
    case SHARDOPT_ERR_INTERNAL: return ErrorCode::internal;
    case SHARDOPT_ERR_OUT_OF_MEMORY: return ErrorCode::out_of_memory;
    default: return ErrorCode::invalid_argument;  // handles, NULLs and struct sizes are bad arguments
  }
}

shardopt_status record_failure(const char* function, shardopt_status status, const char* message) noexcept {
  try {
    t_last_error.assign(function);
    t_last_error.append(": ");
    t_last_error.append(message);
    t_last_error_lost = false;
  } catch (...) {
    t_last_error_lost = true;
  }
  return status;
}

void clear_last_error() noexcept {
  t_last_error.clear();  // keeps its capacity: cannot throw
  t_last_error_lost = false;
}

void check_struct_size(std::size_t given, const char* name, const char* type_name, const std::size_t* known,
                       std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (given == known[i]) return;
  }
  const std::size_t current = known[count - 1];
  const char* why = given < known[0]         ? "too small"
                    : given > current        ? "larger than any version it knows"
                                             : "not the size of any version it knows";
  std::string earlier;
  for (std::size_t i = 0; i + 1 < count; ++i) earlier += fmt::format("{}{}", i == 0 ? "" : ", ", known[i]);
  fail(SHARDOPT_ERR_STRUCT_SIZE,
       "{}->struct_size is {}, but {} is {} bytes in this library{}{}{} ({}); set it to sizeof({}), e.g. with "
       "{}_init()",
       name, given, type_name, current, earlier.empty() ? "" : ", which also accepts ",
       earlier, earlier.empty() ? "" : " from earlier headers", why, type_name, type_name);
}

void register_handle(const void* handle, uint64_t magic) {
  HandleRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live[handle] = magic;
}

void unregister_handle(const void* handle) {
  HandleRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.erase(handle);
}

uint64_t live_handle_kind(const void* handle) {
  HandleRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.live.find(handle);
  return it == r.live.end() ? 0 : it->second;
}

shardopt_comm_s& checked_comm(shardopt_comm_t comm, const char* name) {
  // The one way a program that checks every status still holds a NULL communicator.
  if (comm == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER,
         "{} is NULL; shardopt_comm_split gives a NULL handle on ranks that passed a negative colour "
         "(they join no communicator)",
         name);
  }
  check_handle(comm, kCommMagic, name);
  // The registry says it is live; a wrong magic means its memory was overwritten.
  if (comm->magic != kCommMagic) fail(SHARDOPT_ERR_BAD_HANDLE, "{} is corrupted (bad magic number)", name);
  return *comm;
}

shardopt_optimizer_s& checked_optimizer(shardopt_optimizer_t opt, const char* name) {
  if (opt == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER,
         "{} is NULL; shardopt_optimizer_create leaves its output NULL when it fails", name);
  }
  check_handle(opt, kOptimizerMagic, name);
  if (opt->magic != kOptimizerMagic) fail(SHARDOPT_ERR_BAD_HANDLE, "{} is corrupted (bad magic number)", name);
  return *opt;
}

shardopt_state_dict_s& checked_state_dict(shardopt_state_dict_t dict, const char* name) {
  if (dict == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER, "{} is NULL; shardopt_optimizer_state_dict leaves its output NULL when it fails",
         name);
  }
  check_handle(dict, kStateDictMagic, name);
  if (dict->magic != kStateDictMagic) fail(SHARDOPT_ERR_BAD_HANDLE, "{} is corrupted (bad magic number)", name);
  return *dict;
}

void retain_optimizer(shardopt_optimizer_s& opt) {
  std::lock_guard<std::mutex> lock(lifetime_mutex());
  ++opt.users;
}

void release_optimizer(shardopt_optimizer_s* opt) noexcept {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(lifetime_mutex());
    last = --opt->users == 0 && opt->retired;
  }
  if (last) free_optimizer(opt);
}

void retire_optimizer(shardopt_optimizer_s* opt) noexcept {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(lifetime_mutex());
    opt->retired = true;
    last = opt->users == 0;
  }
  if (last) free_optimizer(opt);
}

}  // namespace capi
}  // namespace shardopt

// ---- the C functions about errors and versions -------------------------------------------------

using namespace shardopt::capi;

extern "C" {

const char* shardopt_last_error(void) {
  return t_last_error_lost ? "shardopt: an error occurred, but its message could not be stored (out of memory)"
                           : t_last_error.c_str();
}

const char* shardopt_status_name(shardopt_status status) {
  switch (status) {
    case SHARDOPT_OK: return "SHARDOPT_OK";
    case SHARDOPT_ERR_INVALID_ARGUMENT: return "SHARDOPT_ERR_INVALID_ARGUMENT";
    case SHARDOPT_ERR_MISMATCH: return "SHARDOPT_ERR_MISMATCH";
    case SHARDOPT_ERR_COMM: return "SHARDOPT_ERR_COMM";
    case SHARDOPT_ERR_IO: return "SHARDOPT_ERR_IO";
    case SHARDOPT_ERR_CORRUPT: return "SHARDOPT_ERR_CORRUPT";
    case SHARDOPT_ERR_UNSUPPORTED: return "SHARDOPT_ERR_UNSUPPORTED";
    case SHARDOPT_ERR_CUDA: return "SHARDOPT_ERR_CUDA";
    case SHARDOPT_ERR_TIMEOUT: return "SHARDOPT_ERR_TIMEOUT";
    case SHARDOPT_ERR_INTERNAL: return "SHARDOPT_ERR_INTERNAL";
    case SHARDOPT_ERR_BAD_HANDLE: return "SHARDOPT_ERR_BAD_HANDLE";
    case SHARDOPT_ERR_NULL_POINTER: return "SHARDOPT_ERR_NULL_POINTER";
    case SHARDOPT_ERR_STRUCT_SIZE: return "SHARDOPT_ERR_STRUCT_SIZE";
    case SHARDOPT_ERR_OUT_OF_MEMORY: return "SHARDOPT_ERR_OUT_OF_MEMORY";
  }
  return "SHARDOPT_ERR_UNKNOWN";
}

const char* shardopt_version(void) { return shardopt::version(); }

shardopt_status shardopt_tensor_from_dlpack(const DLManagedTensorVersioned* tensor, shardopt_tensor* out) {
  return guard("shardopt_tensor_from_dlpack", [&] {
    check_not_null(tensor, "tensor");
    check_not_null(out, "out");
    const shardopt::TensorRef ref = shardopt::tensor_from_dlpack(*tensor, "tensor");
    out->data = ref.data;
    out->numel = ref.numel;
    out->dtype = static_cast<shardopt_dtype>(ref.dtype);
    out->device_kind = ref.device.is_cuda() ? SHARDOPT_DEVICE_CUDA : SHARDOPT_DEVICE_CPU;
    out->device_index = ref.device.is_cuda() ? ref.device.index : 0;
  });
}

}  // extern "C"
