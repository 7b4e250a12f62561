/* shardopt/shardopt_remote.h — the remote optimizer's C ABI (shardopt/remote.hpp): owners of named parameters, gradient contexts pushed by trainers, step(context) on the owners. */
#ifndef SHARDOPT_SHARDOPT_REMOTE_H_
#define SHARDOPT_SHARDOPT_REMOTE_H_

/* The conventions of shardopt.h hold (statuses, shardopt_last_error, struct_size, checked
 * handles). Only shardopt_remote_create, save and load are collective; the trainer calls are
 * point-to-point and may be made by each rank on its own. */

#include "shardopt/shardopt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shardopt_remote_s* shardopt_remote_t;
typedef struct shardopt_remote_step_s* shardopt_remote_step_t;

/* Rows [row_begin, row_end) of a parameter of `rows` rows of `row_size` f32 that this rank owns
 * (row_end -1: all); `initial` holds (row_end - row_begin) * row_size values, copied (NULL: 0). */
typedef struct shardopt_remote_param_spec {
  const char* name;
  int64_t rows;
  int64_t row_size;
  int64_t row_begin;
  int64_t row_end;
  const float* initial;
} shardopt_remote_param_spec;

typedef struct shardopt_remote_group {
  shardopt_algorithm algorithm;
  const shardopt_hyperparams* hyper; /* NULL: the algorithm's defaults (shardopt_default_hyperparams) */
  const shardopt_remote_param_spec* params;
  int32_t num_params;
} shardopt_remote_group;

typedef struct shardopt_remote_options {
  size_t struct_size;
  int32_t trainer;                 /* this rank pushes and steps */
  int32_t deterministic;           /* 0: arrival order; 1: by step number, then trainer rank */
  double timeout_seconds;          /* a trainer's wait on an owner */
  double context_expiry_seconds;   /* an untouched context, a silent trainer */
  int32_t max_open_contexts;
  int32_t cpu_threads;
  /* appended (a struct_size through cpu_threads is still accepted, with the default): bytes of
   * pushes an owner keeps per context as received before summing them; 0 sums each on arrival;
   * negative is refused (RemoteOptions::push_log_bytes) */
  int64_t push_log_bytes;
} shardopt_remote_options;

static inline void shardopt_remote_options_init(shardopt_remote_options* options) {
  options->struct_size = sizeof(shardopt_remote_options);
  options->trainer = 1;
  options->deterministic = 0;
  options->timeout_seconds = 60.0;
  options->context_expiry_seconds = 120.0;
  options->max_open_contexts = 8;
  options->cpu_threads = 0;
  options->push_log_bytes = (int64_t)64 << 20;
}

/* A parameter as lookup names it. */
typedef struct shardopt_remote_param {
  int32_t id;
  int64_t rows;
  int64_t row_size;
  uint64_t check;
} shardopt_remote_param;

typedef struct shardopt_remote_stats {
  size_t struct_size;
  int64_t pushes_received;
  int64_t bytes_received;
  int64_t contexts_applied;
  int64_t contexts_failed;
  int64_t contexts_expired;
  int64_t trainers_gone;
  int64_t open_contexts;
  int64_t accumulator_bytes;
  int64_t pooled_bytes; /* appended: a struct_size through accumulator_bytes is still accepted */
  int64_t logged_bytes; /* appended (through pooled_bytes still accepted): pushes received, not yet summed
                         * (part of accumulator_bytes) */
} shardopt_remote_stats;

/* shardopt_comm_world with MPI initialised for MPI_THREAD_MULTIPLE (the owners' service thread). */
SHARDOPT_C_API shardopt_status shardopt_remote_mpi_world(const shardopt_comm_options* options, shardopt_comm_t* out);
/* Collective. `groups` may be NULL when num_groups is 0 (a rank owning nothing). */
SHARDOPT_C_API shardopt_status shardopt_remote_create(shardopt_comm_t comm, const shardopt_remote_group* groups,
                                                     int32_t num_groups, const shardopt_remote_options* options,
                                                     shardopt_remote_t* out);
/* Closes (as shardopt_remote_close) if needed, then frees. */
SHARDOPT_C_API shardopt_status shardopt_remote_destroy(shardopt_remote_t remote);
SHARDOPT_C_API shardopt_status shardopt_remote_lookup(shardopt_remote_t remote, const char* name,
                                                     shardopt_remote_param* out);
SHARDOPT_C_API shardopt_status shardopt_remote_open_context(shardopt_remote_t remote, int64_t* out);
/* Asynchronous: `grad` (and `rows`, `values`) are read until the context's step was waited for. */
SHARDOPT_C_API shardopt_status shardopt_remote_push(shardopt_remote_t remote, int64_t context,
                                                   const shardopt_remote_param* param, const float* grad,
                                                   int64_t numel);
SHARDOPT_C_API shardopt_status shardopt_remote_push_rows(shardopt_remote_t remote, int64_t context,
                                                        const shardopt_remote_param* param, const int64_t* rows,
                                                        int64_t count, const float* values);
SHARDOPT_C_API shardopt_status shardopt_remote_step(shardopt_remote_t remote, int64_t context);
SHARDOPT_C_API shardopt_status shardopt_remote_step_async(shardopt_remote_t remote, int64_t context,
                                                         shardopt_remote_step_t* out);
/* Waits for the step and frees its handle (also when it fails). */
SHARDOPT_C_API shardopt_status shardopt_remote_step_wait(shardopt_remote_step_t step);
SHARDOPT_C_API shardopt_status shardopt_remote_pull(shardopt_remote_t remote, const shardopt_remote_param* param,
                                                   float* out, int64_t numel);
SHARDOPT_C_API shardopt_status shardopt_remote_pull_rows(shardopt_remote_t remote, const shardopt_remote_param* param,
                                                        const int64_t* rows, int64_t count, float* out);
SHARDOPT_C_API shardopt_status shardopt_remote_close(shardopt_remote_t remote);
/* Collective. */
SHARDOPT_C_API shardopt_status shardopt_remote_save(shardopt_remote_t remote, const char* dir);
SHARDOPT_C_API shardopt_status shardopt_remote_load(shardopt_remote_t remote, const char* dir);
SHARDOPT_C_API shardopt_status shardopt_remote_get_stats(shardopt_remote_t remote, shardopt_remote_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* SHARDOPT_SHARDOPT_REMOTE_H_ */
