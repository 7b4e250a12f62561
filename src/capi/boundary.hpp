// src/capi/boundary.hpp — what every extern "C" function does at the boundary: catch everything, map it to a status, keep the message per thread, check pointers, struct sizes and handles.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dlpack_import.hpp"
#include "shardopt/error.hpp"
#include "shardopt/shardopt.h"
#include "shardopt/shardopt_remote.h"
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
  // Handles built over this optimizer (averagers) that keep it alive, and whether its own
  // handle was destroyed; both guarded by one lock (see retain_optimizer).
  int users = 0;
  bool retired = false;
};

// A copy of a consolidated state dict with what C callers read beside it: each parameter's
// numel, dtype and group, and its state kinds in order (map order: by name).
struct shardopt_state_dict_s {
  uint64_t magic = 0;
  shardopt::StateDict dict;
  struct Param {
    int64_t numel = 0;
    shardopt::DType dtype = shardopt::DType::f32;
    int32_t group = 0;
  };
  std::vector<Param> params;                    // by global id
  std::vector<std::vector<std::string>> kinds;  // by global id; empty without state
};

namespace shardopt {
namespace capi {

constexpr uint64_t kStateDictMagic = 0x73686172645f7364ull;  // "shard_sd"
constexpr uint64_t kCommMagic = 0x73686172645f636dull;       // "shard_cm"
constexpr uint64_t kOptimizerMagic = 0x73686172645f6f70ull;  // "shard_op"
constexpr uint64_t kModelAveragerMagic = 0x73686172645f6d61ull;  // "shard_ma"
constexpr uint64_t kPostLocalSgdMagic = 0x73686172645f706cull;   // "shard_pl"

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
    return record_failure(function, SHARDOPT_ERR_OUT_OF_MEMORY, "out of memory");
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

// ---- struct_size ------------------------------------------------------------------------------
//
// Structs carry the size their caller was compiled with. Fields are only ever appended, so the
// size of each earlier version of a struct names a prefix of today's layout; the library accepts
// those sizes and then reads or writes only that prefix's fields (appended fields may even start
// inside an earlier version's tail padding, as shardopt_optimizer_config.stage does, so a field
// is present only when struct_size is at least a version that declares it, never merely when
// offsetof + sizeof fits). Any other size is refused.
//
// The earlier versions, declared as their headers did (so their sizes follow the platform's
// layout rules, as the caller's compiler applied them).
namespace v1 {
struct optimizer_config {  // through `threads`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
};
struct memory_report {  // through trainable_numel
  size_t struct_size;
  int64_t state_bytes;
  int64_t param_buffer_bytes;
  int64_t grad_buffer_bytes;
  int64_t shard_numel;
  int64_t trainable_numel;
};
}  // namespace v1
namespace v2 {
struct optimizer_config {  // through `loss_scaling`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
};
struct memory_report {  // through buffer_bytes
  size_t struct_size;
  int64_t state_bytes;
  int64_t param_buffer_bytes;
  int64_t grad_buffer_bytes;
  int64_t shard_numel;
  int64_t trainable_numel;
  int64_t master_bytes;
  int64_t param_bytes;
  int64_t grad_bytes;
  int64_t buffer_bytes;
};
}  // namespace v2
namespace v3 {
struct optimizer_config {  // through `defaults`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
};
}  // namespace v3
namespace v4 {
struct optimizer_config {  // through `node_shared_params`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
};
}  // namespace v4
namespace v5 {
struct optimizer_config {  // through `pipeline_chunk_bytes`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
};
}  // namespace v5
namespace v6 {
struct optimizer_config {  // through `divide_by_initial_world_size`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
};
}  // namespace v6
namespace v7 {
struct optimizer_config {  // through `overlap`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
  int64_t overlap;
};
}  // namespace v7
namespace v8 {
struct optimizer_config {  // through `muon_blas_threads`
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
  int64_t overlap;
  int32_t muon_precision;
  int32_t muon_blas_threads;
};
}  // namespace v8
namespace v1 {
struct hyperparams {  // through `amsgrad`
  size_t struct_size;
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int32_t nesterov, maximize, amsgrad;
};
struct param_desc {  // through `grad_dlpack`
  size_t struct_size;
  const char* name;
  shardopt_tensor param;
  shardopt_tensor grad;
  DLManagedTensorVersioned* param_dlpack;
  DLManagedTensorVersioned* grad_dlpack;
};
struct param_group_desc {  // through `hyperparams`
  size_t struct_size;
  const shardopt_param_desc* params;
  size_t num_params;
  const shardopt_hyperparams* hyperparams;
};
}  // namespace v1
namespace v1 {
struct comm_options {  // through timeout_seconds
  size_t struct_size;
  double timeout_seconds;
};
struct step_report {  // through skipped_steps
  size_t struct_size;
  int32_t skipped;
  double loss_scale;
  double grad_norm;
  double clip_coef;
  int64_t skipped_steps;
};
}  // namespace v1
namespace v2 {
struct step_report {  // through sync_seconds
  size_t struct_size;
  int32_t skipped;
  double loss_scale;
  double grad_norm;
  double clip_coef;
  int64_t skipped_steps;
  double agree_seconds;
  double update_seconds;
  double sync_seconds;
};
}  // namespace v2
namespace v1 {
struct remote_options {  // through cpu_threads
  size_t struct_size;
  int32_t trainer;
  int32_t deterministic;
  double timeout_seconds;
  double context_expiry_seconds;
  int32_t max_open_contexts;
  int32_t cpu_threads;
};
struct remote_stats {  // through accumulator_bytes
  size_t struct_size;
  int64_t pushes_received, bytes_received, contexts_applied, contexts_failed, contexts_expired, trainers_gone,
      open_contexts, accumulator_bytes;
};
}  // namespace v1
namespace v2 {
struct remote_stats {  // through pooled_bytes
  size_t struct_size;
  int64_t pushes_received, bytes_received, contexts_applied, contexts_failed, contexts_expired, trainers_gone,
      open_contexts, accumulator_bytes, pooled_bytes;
};
}  // namespace v2

// Each earlier version is a prefix of today's struct: same fields at the same offsets.
#define SHARDOPT_CAPI_SAME_FIELD(v1_type, type, field) \
  static_assert(offsetof(v1_type, field) == offsetof(type, field) && \
                sizeof(v1_type::field) == sizeof(type::field), #type "." #field " moved")
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, struct_size);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, algorithm);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, partition);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, storage);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, shard_state);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, bucket_bytes);
SHARDOPT_CAPI_SAME_FIELD(v1::optimizer_config, shardopt_optimizer_config, threads);
SHARDOPT_CAPI_SAME_FIELD(v2::optimizer_config, shardopt_optimizer_config, threads);
SHARDOPT_CAPI_SAME_FIELD(v2::optimizer_config, shardopt_optimizer_config, stage);
SHARDOPT_CAPI_SAME_FIELD(v2::optimizer_config, shardopt_optimizer_config, stochastic_rounding);
SHARDOPT_CAPI_SAME_FIELD(v2::optimizer_config, shardopt_optimizer_config, rounding_seed);
SHARDOPT_CAPI_SAME_FIELD(v2::optimizer_config, shardopt_optimizer_config, loss_scaling);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, struct_size);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, state_bytes);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, param_buffer_bytes);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, grad_buffer_bytes);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, shard_numel);
SHARDOPT_CAPI_SAME_FIELD(v1::memory_report, shardopt_memory_report, trainable_numel);
SHARDOPT_CAPI_SAME_FIELD(v3::optimizer_config, shardopt_optimizer_config, defaults);
SHARDOPT_CAPI_SAME_FIELD(v2::memory_report, shardopt_memory_report, buffer_bytes);
SHARDOPT_CAPI_SAME_FIELD(v4::optimizer_config, shardopt_optimizer_config, node_shared_params);
SHARDOPT_CAPI_SAME_FIELD(v5::optimizer_config, shardopt_optimizer_config, pipeline_chunk_bytes);
SHARDOPT_CAPI_SAME_FIELD(v6::optimizer_config, shardopt_optimizer_config, divide_by_initial_world_size);
SHARDOPT_CAPI_SAME_FIELD(v7::optimizer_config, shardopt_optimizer_config, overlap);
SHARDOPT_CAPI_SAME_FIELD(v8::optimizer_config, shardopt_optimizer_config, muon_blas_threads);
SHARDOPT_CAPI_SAME_FIELD(v1::hyperparams, shardopt_hyperparams, amsgrad);
SHARDOPT_CAPI_SAME_FIELD(v1::param_desc, shardopt_param_desc, grad_dlpack);
SHARDOPT_CAPI_SAME_FIELD(v1::param_group_desc, shardopt_param_group_desc, hyperparams);
SHARDOPT_CAPI_SAME_FIELD(v1::comm_options, shardopt_comm_options, timeout_seconds);
SHARDOPT_CAPI_SAME_FIELD(v1::step_report, shardopt_step_report, skipped_steps);
SHARDOPT_CAPI_SAME_FIELD(v2::step_report, shardopt_step_report, sync_seconds);
SHARDOPT_CAPI_SAME_FIELD(v1::remote_options, shardopt_remote_options, cpu_threads);
SHARDOPT_CAPI_SAME_FIELD(v1::remote_stats, shardopt_remote_stats, accumulator_bytes);
SHARDOPT_CAPI_SAME_FIELD(v2::remote_stats, shardopt_remote_stats, pooled_bytes);
#undef SHARDOPT_CAPI_SAME_FIELD

static_assert(sizeof(v1::optimizer_config) < sizeof(v2::optimizer_config) &&
                  sizeof(v2::optimizer_config) < sizeof(v3::optimizer_config) &&
                  sizeof(v3::optimizer_config) < sizeof(v4::optimizer_config) &&
                  sizeof(v4::optimizer_config) < sizeof(v5::optimizer_config) &&
                  sizeof(v5::optimizer_config) < sizeof(v6::optimizer_config) &&
                  sizeof(v6::optimizer_config) < sizeof(v7::optimizer_config) &&
                  sizeof(v7::optimizer_config) < sizeof(v8::optimizer_config) &&
                  sizeof(v8::optimizer_config) < sizeof(shardopt_optimizer_config),
              "each version of shardopt_optimizer_config must have a size of its own");

// Every size the library accepts for `Struct`, oldest first; the last is its own sizeof.
template <typename Struct>
struct KnownSizes {
  static constexpr std::array<std::size_t, 1> values = {sizeof(Struct)};
};
template <>
struct KnownSizes<shardopt_optimizer_config> {
  static constexpr std::array<std::size_t, 9> values = {sizeof(v1::optimizer_config), sizeof(v2::optimizer_config),
                                                        sizeof(v3::optimizer_config), sizeof(v4::optimizer_config),
                                                        sizeof(v5::optimizer_config), sizeof(v6::optimizer_config),
                                                        sizeof(v7::optimizer_config), sizeof(v8::optimizer_config),
                                                        sizeof(shardopt_optimizer_config)};
};
template <>
struct KnownSizes<shardopt_hyperparams> {
  static constexpr std::array<std::size_t, 2> values = {sizeof(v1::hyperparams), sizeof(shardopt_hyperparams)};
};
template <>
struct KnownSizes<shardopt_param_desc> {
  static constexpr std::array<std::size_t, 2> values = {sizeof(v1::param_desc), sizeof(shardopt_param_desc)};
};
template <>
struct KnownSizes<shardopt_param_group_desc> {
  static constexpr std::array<std::size_t, 2> values = {sizeof(v1::param_group_desc),
                                                        sizeof(shardopt_param_group_desc)};
};
template <>
struct KnownSizes<shardopt_comm_options> {
  static constexpr std::array<std::size_t, 2> values = {sizeof(v1::comm_options), sizeof(shardopt_comm_options)};
};
template <>
struct KnownSizes<shardopt_step_report> {
  static constexpr std::array<std::size_t, 3> values = {sizeof(v1::step_report), sizeof(v2::step_report),
                                                        sizeof(shardopt_step_report)};
};
template <>
struct KnownSizes<shardopt_memory_report> {
  static constexpr std::array<std::size_t, 3> values = {sizeof(v1::memory_report), sizeof(v2::memory_report),
                                                        sizeof(shardopt_memory_report)};
};
template <>
struct KnownSizes<shardopt_remote_options> {
  static constexpr std::array<std::size_t, 2> values = {sizeof(v1::remote_options), sizeof(shardopt_remote_options)};
};
template <>
struct KnownSizes<shardopt_remote_stats> {
  static constexpr std::array<std::size_t, 3> values = {sizeof(v1::remote_stats), sizeof(v2::remote_stats),
                                                        sizeof(shardopt_remote_stats)};
};

// Whether the caller's struct (of an accepted size) has the fields appended after `Earlier`.
template <typename Earlier, typename Struct>
bool newer_than(const Struct* s) {
  return s->struct_size > sizeof(Earlier);
}

// Refuses a size not in `known` (ascending; the last is sizeof the current struct).
void check_struct_size(std::size_t given, const char* name, const char* type_name, const std::size_t* known,
                       std::size_t count);

template <typename Struct>
void check_struct(const Struct* s, const char* name, const char* type_name) {
  check_not_null(s, name);
  using Known = KnownSizes<Struct>;
  static_assert(Known::values.back() == sizeof(Struct), "the current size comes last");
  check_struct_size(s->struct_size, name, type_name, Known::values.data(), Known::values.size());
}

// The handle registry: every live handle with its kind (its magic), so that checks never
// dereference a dead or foreign pointer. Returns 0 for a pointer that is not a live handle.
void register_handle(const void* handle, uint64_t magic);
void unregister_handle(const void* handle);
uint64_t live_handle_kind(const void* handle);

// Refuses a handle that is NULL, not live, or of another kind than `magic`, by name.
void check_handle(const void* handle, uint64_t magic, const char* name);

shardopt_comm_s& checked_comm(shardopt_comm_t comm, const char* name);
shardopt_optimizer_s& checked_optimizer(shardopt_optimizer_t opt, const char* name);
shardopt_state_dict_s& checked_state_dict(shardopt_state_dict_t dict, const char* name);

// An optimizer outlives the handles built over it (averagers hold a ZeroOptimizer&): each such
// handle retains it at creation and releases it when destroyed; shardopt_optimizer_destroy
// retires the handle, and whichever comes last frees the optimizer and its DLPack tensors.
void retain_optimizer(shardopt_optimizer_s& opt);
void release_optimizer(shardopt_optimizer_s* opt) noexcept;
void retire_optimizer(shardopt_optimizer_s* opt) noexcept;

}  // namespace capi
}  // namespace shardopt
