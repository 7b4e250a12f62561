/* tests/remote/c99_remote.c — the remote optimizer's C ABI from C99: rank 0 owns a table, every rank pushes two rows and steps in deterministic order; the pulled table must hold the exact sums; a bad handle and an out-of-range row fail by name; the owner's stats count the contexts, the pushes' exact bytes and the pooled buffers, and nothing left logged (the structs before pooled_bytes and before logged_bytes still accepted, unwritten past them); push_log_bytes reaches the agreed construction (negative or unequal across ranks: a named error on every rank; the options struct before it still accepted). Prints "C99-REMOTE ok". */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "shardopt/shardopt_remote.h"

#define CHECK(call)                                                             \
  do {                                                                          \
    shardopt_status s_ = (call);                                                \
    if (s_ != SHARDOPT_OK) {                                                    \
      fprintf(stderr, "%s failed: %s\n", #call, shardopt_last_error());         \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

/* Whether `status` is `expected` with `fragment` in the last error (printed when not). */
static int refused(shardopt_status status, shardopt_status expected, const char* fragment, const char* what) {
  if (status == expected && strstr(shardopt_last_error(), fragment) != NULL) return 1;
  fprintf(stderr, "%s: status %d, expected %d with '%s': %s\n", what, (int)status, (int)expected, fragment,
          status == SHARDOPT_OK ? "(none)" : shardopt_last_error());
  return 0;
}

/* push_log_bytes reaches the construction's agreement: a negative cap, and (on 2 ranks or more)
   caps unequal across ranks, fail by name on every rank; the struct before it is accepted. */
static int check_push_log_refusals(shardopt_comm_t comm, const shardopt_remote_group* group,
                                   const shardopt_remote_options* defaults, int rank, int size) {
  shardopt_remote_options o = *defaults;
  shardopt_remote_t remote = NULL;
  int ok = 1;
  o.push_log_bytes = -1;
  ok &= refused(shardopt_remote_create(comm, rank == 0 ? group : NULL, rank == 0 ? 1 : 0, &o, &remote),
                SHARDOPT_ERR_INVALID_ARGUMENT, "RemoteOptions.push_log_bytes is -1", "a negative push_log_bytes");
  if (size > 1) {
    o.push_log_bytes = rank == 0 ? 1000 : 2000;
    ok &= refused(shardopt_remote_create(comm, rank == 0 ? group : NULL, rank == 0 ? 1 : 0, &o, &remote),
                  SHARDOPT_ERR_MISMATCH, "ranks disagree on RemoteOptions.push_log_bytes: rank 0 has 1000, rank 1 has 2000",
                  "push_log_bytes unequal across ranks");
  }
  o = *defaults;
  o.struct_size = offsetof(shardopt_remote_options, push_log_bytes);
  o.push_log_bytes = -1; /* past the caller's struct: not read */
  if (shardopt_remote_create(comm, rank == 0 ? group : NULL, rank == 0 ? 1 : 0, &o, &remote) != SHARDOPT_OK) {
    fprintf(stderr, "the options struct before push_log_bytes was refused: %s\n", shardopt_last_error());
    return 0;
  }
  if (shardopt_remote_close(remote) != SHARDOPT_OK || shardopt_remote_destroy(remote) != SHARDOPT_OK) return 0;
  o.struct_size = sizeof o - 4;
  ok &= refused(shardopt_remote_create(comm, rank == 0 ? group : NULL, rank == 0 ? 1 : 0, &o, &remote),
                SHARDOPT_ERR_STRUCT_SIZE, "shardopt_remote_options", "a remote options size of no version");
  return ok;
}

int main(void) {
  shardopt_comm_options comm_options;
  shardopt_comm_t comm = NULL;
  shardopt_remote_options options;
  shardopt_remote_param_spec spec;
  shardopt_remote_group group;
  shardopt_hyperparams hyper;
  shardopt_remote_t remote = NULL;
  shardopt_remote_param table, bad;
  shardopt_remote_step_t step = NULL;
  shardopt_remote_stats stats;
  float values[8], pulled[32];
  int64_t rows[2] = {1, 3}, out_of_range[1] = {8}, context = 0;
  int rank = 0, size = 1, i, ok = 1;

  shardopt_comm_options_init(&comm_options);
  comm_options.timeout_seconds = 20;
  CHECK(shardopt_remote_mpi_world(&comm_options, &comm));
  CHECK(shardopt_comm_rank(comm, &rank));
  CHECK(shardopt_comm_size(comm, &size));

  shardopt_hyperparams_init(&hyper);
  hyper.lr = 1.0;
  spec.name = "table";
  spec.rows = 8;
  spec.row_size = 4;
  spec.row_begin = 0;
  spec.row_end = -1;
  spec.initial = NULL;
  group.algorithm = SHARDOPT_ALGORITHM_SGD;
  group.hyper = &hyper;
  group.params = &spec;
  group.num_params = 1;
  shardopt_remote_options_init(&options);
  options.deterministic = 1;
  options.timeout_seconds = 20;
  if (options.push_log_bytes != (int64_t)64 << 20) {
    fprintf(stderr, "shardopt_remote_options_init set push_log_bytes %lld\n", (long long)options.push_log_bytes);
    ok = 0;
  }
  if (!check_push_log_refusals(comm, &group, &options, rank, size)) ok = 0;
  options.push_log_bytes = 1000; /* the two rows' 48 payload bytes (plus a header) are logged */
  CHECK(shardopt_remote_create(comm, rank == 0 ? &group : NULL, rank == 0 ? 1 : 0, &options, &remote));
  CHECK(shardopt_remote_lookup(remote, "table", &table));

  for (i = 0; i < 8; ++i) values[i] = 1.0f / 64;
  CHECK(shardopt_remote_open_context(remote, &context));
  bad = table;
  bad.id = 99;
  if (shardopt_remote_push(remote, context, &bad, values, 32) != SHARDOPT_ERR_INVALID_ARGUMENT ||
      strstr(shardopt_last_error(), "bad parameter handle") == NULL) {
    fprintf(stderr, "a bad handle was not refused by name: %s\n", shardopt_last_error());
    ok = 0;
  }
  if (shardopt_remote_push_rows(remote, context, &table, out_of_range, 1, values) != SHARDOPT_ERR_INVALID_ARGUMENT ||
      strstr(shardopt_last_error(), "row 8 (index 0) is out of range") == NULL) {
    fprintf(stderr, "an out-of-range row was not refused by name: %s\n", shardopt_last_error());
    ok = 0;
  }
  CHECK(shardopt_remote_push_rows(remote, context, &table, rows, 2, values));
  CHECK(shardopt_remote_step_async(remote, context, &step));
  CHECK(shardopt_remote_step_wait(step));
  CHECK(shardopt_comm_barrier(comm));
  CHECK(shardopt_remote_pull(remote, &table, pulled, 32));
  for (i = 0; i < 32; ++i) {
    const int row = i / 4;
    const float expected = (row == 1 || row == 3) ? -(float)size / 64 : 0.0f;
    if (pulled[i] != expected) {
      fprintf(stderr, "element %d holds %g, expected %g\n", i, pulled[i], expected);
      ok = 0;
      break;
    }
  }
  CHECK(shardopt_remote_close(remote));
  /* After close the owner's counts are final: one context per trainer applied, none open, and
     the applied sparse sums' buffers kept for reuse (at least the 8-row index, bounded). */
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  stats.logged_bytes = -5;
  CHECK(shardopt_remote_get_stats(remote, &stats));
  /* Received: one push per trainer of 2 row indices (int64) and 2 x 4 f32 values, 48 bytes
     (the refused pushes above never left the trainer); all of it summed and applied by now. */
  if (rank == 0 && (stats.contexts_applied != size || stats.open_contexts != 0 || stats.accumulator_bytes != 0 ||
                    stats.pooled_bytes < 8 * 4 || stats.pooled_bytes > 4096 || stats.pushes_received != size ||
                    stats.bytes_received != 48 * (int64_t)size || stats.logged_bytes != 0)) {
    fprintf(stderr, "owner stats: applied %lld open %lld accumulator %lld pooled %lld pushes %lld bytes %lld logged %lld\n",
            (long long)stats.contexts_applied, (long long)stats.open_contexts, (long long)stats.accumulator_bytes,
            (long long)stats.pooled_bytes, (long long)stats.pushes_received, (long long)stats.bytes_received,
            (long long)stats.logged_bytes);
    ok = 0;
  }
  if (rank != 0 && (stats.pushes_received != 0 || stats.logged_bytes != 0)) {
    fprintf(stderr, "a rank owning nothing counts pushes %lld logged %lld\n", (long long)stats.pushes_received,
            (long long)stats.logged_bytes);
    ok = 0;
  }
  memset(&stats, 0, sizeof stats);
  stats.struct_size = offsetof(shardopt_remote_stats, logged_bytes);
  stats.logged_bytes = -7;
  CHECK(shardopt_remote_get_stats(remote, &stats));
  if (stats.logged_bytes != -7 || (rank == 0 && stats.pooled_bytes < 8 * 4)) {
    fprintf(stderr, "the struct before logged_bytes: logged %lld pooled %lld\n", (long long)stats.logged_bytes,
            (long long)stats.pooled_bytes);
    ok = 0;
  }
  memset(&stats, 0, sizeof stats);
  stats.struct_size = offsetof(shardopt_remote_stats, pooled_bytes);
  stats.pooled_bytes = -7;
  CHECK(shardopt_remote_get_stats(remote, &stats));
  if (stats.pooled_bytes != -7) {
    fprintf(stderr, "the struct before pooled_bytes had it written: %lld\n", (long long)stats.pooled_bytes);
    ok = 0;
  }
  stats.struct_size = sizeof stats - 4;
  if (shardopt_remote_get_stats(remote, &stats) != SHARDOPT_ERR_STRUCT_SIZE ||
      strstr(shardopt_last_error(), "shardopt_remote_stats") == NULL) {
    fprintf(stderr, "a struct size between the accepted ones was not refused by name: %s\n", shardopt_last_error());
    ok = 0;
  }
  CHECK(shardopt_remote_destroy(remote));
  CHECK(shardopt_comm_destroy(comm));
  printf("C99-REMOTE %s rank %d\n", ok ? "ok" : "FAILED", rank);
  return ok ? 0 : 1;
}
