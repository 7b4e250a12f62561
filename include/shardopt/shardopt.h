/* shardopt/shardopt.h — the C ABI: opaque handles, config structs led by struct_size, status codes; nothing throws across it. */
#ifndef SHARDOPT_SHARDOPT_H_
#define SHARDOPT_SHARDOPT_H_

/* Conventions (every function below follows them):
 *  - Each function returns a shardopt_status. On failure shardopt_last_error() holds a message
 *    naming the function and what was wrong (parameter, rank, file); it is per thread and stays
 *    valid until the next shardopt_* call on that thread. A successful call clears it to "".
 *  - Structs passed in or filled out begin with `size_t struct_size`, set by the caller to
 *    sizeof(the struct) as its header declared it (the shardopt_*_init helpers do that). New
 *    fields are only ever appended, and the library still accepts the size of every earlier
 *    version of a struct (it then reads, or fills in, only that version's fields; the fields
 *    added since take their defaults). A size it does not know, such as one from a newer header,
 *    is refused with SHARDOPT_ERR_STRUCT_SIZE, so a program built against another version of
 *    this header fails cleanly instead of reading or writing past a struct.
 *  - Handles are checked: a destroyed, never-created or wrong-kind handle gives
 *    SHARDOPT_ERR_BAD_HANDLE (without being dereferenced); NULL gives SHARDOPT_ERR_NULL_POINTER,
 *    as does any other NULL pointer argument, except for the destroy functions (a no-op).
 *    A NULL handle is also what a call that fails leaves in its output, and what
 *    shardopt_comm_split gives a rank that passed a negative colour; its message says so.
 *  - Calls marked "collective" must be made by every rank of the communicator, in the same
 *    order. Create and add_param_group fail on every rank together when one rank's arguments
 *    are wrong; any collective that a peer never joins fails with SHARDOPT_ERR_TIMEOUT after
 *    shardopt_comm_options.timeout_seconds instead of hanging.
 *  - The header needs neither mpi.h nor CUDA headers (MPI communicators and CUDA streams are
 *    passed as void pointers). */

#include <stddef.h>
#include <stdint.h>

#include "shardopt/dlpack.h"

/* Symbols of the C ABI are the only C symbols the shared library exports. */
#if defined(_WIN32)
#define SHARDOPT_C_API
#else
#define SHARDOPT_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, errors, version ------------------------------------------------------------- */

typedef enum shardopt_status {
  SHARDOPT_OK = 0,
  SHARDOPT_ERR_INVALID_ARGUMENT = 1,
  SHARDOPT_ERR_MISMATCH = 2,     /* ranks disagree (registration, sizes, collective arguments) */
  SHARDOPT_ERR_COMM = 3,         /* a collective failed */
  SHARDOPT_ERR_IO = 4,
  SHARDOPT_ERR_CORRUPT = 5,      /* a checkpoint failed its checks */
  SHARDOPT_ERR_UNSUPPORTED = 6,  /* valid, but not in this build (dtype, device, NCCL...) */
  SHARDOPT_ERR_CUDA = 7,
  SHARDOPT_ERR_TIMEOUT = 8,      /* a collective did not finish in time (dead or diverged peer) */
  SHARDOPT_ERR_INTERNAL = 9,     /* a bug in shardopt */
  SHARDOPT_ERR_BAD_HANDLE = 10,  /* destroyed, never created, or the wrong kind of handle */
  SHARDOPT_ERR_NULL_POINTER = 11,
  SHARDOPT_ERR_STRUCT_SIZE = 12, /* struct_size is not one this library knows */
  SHARDOPT_ERR_OUT_OF_MEMORY = 13 /* an allocation failed (the message names what and its bytes) */
} shardopt_status;

/* The message of the last failed call on this thread ("" after a successful one). Never NULL. */
SHARDOPT_C_API const char* shardopt_last_error(void);
/* "SHARDOPT_ERR_MISMATCH" and so on; "SHARDOPT_ERR_UNKNOWN" for values not listed above. */
SHARDOPT_C_API const char* shardopt_status_name(shardopt_status status);
/* The library's version, "major.minor.patch". */
SHARDOPT_C_API const char* shardopt_version(void);

/* ---- tensors ------------------------------------------------------------------------------- */

typedef enum shardopt_dtype {
  SHARDOPT_DTYPE_F32 = 0,
  SHARDOPT_DTYPE_BF16 = 1,
  SHARDOPT_DTYPE_F16 = 2,
  SHARDOPT_DTYPE_BYTE = 3 /* raw bytes: broadcast and all_gather only; never a tensor's dtype */
} shardopt_dtype;

typedef enum shardopt_device_kind {
  SHARDOPT_DEVICE_CPU = 0,
  SHARDOPT_DEVICE_CUDA = 1
} shardopt_device_kind;

/* A contiguous buffer the caller owns: `numel` elements of `dtype` at `data`. This struct is
 * frozen (it is embedded in other structs and filled by the view functions), so it carries no
 * struct_size. */
typedef struct shardopt_tensor {
  void* data;
  int64_t numel;
  shardopt_dtype dtype;
  shardopt_device_kind device_kind;
  int32_t device_index; /* CUDA device ordinal; 0 for the CPU */
} shardopt_tensor;

/* Checks a DLPack tensor the way the optimizer does before accepting it, and describes it:
 * a compact (row-major, strides NULL or matching the shape) float32, bfloat16 or float16 tensor
 * with one lane on kDLCPU or kDLCUDA, not flagged read-only, DLPack major version 1. Refusals:
 * SHARDOPT_ERR_UNSUPPORTED for a dtype, device or DLPack major version shardopt cannot take,
 * SHARDOPT_ERR_INVALID_ARGUMENT for a strided, read-only or malformed tensor. Does not take
 * ownership: the deleter is not called. */
SHARDOPT_C_API shardopt_status shardopt_tensor_from_dlpack(const DLManagedTensorVersioned* tensor,
                                                           shardopt_tensor* out);

/* ---- communicators ------------------------------------------------------------------------- */

typedef struct shardopt_comm_s* shardopt_comm_t;

typedef struct shardopt_comm_options {
  size_t struct_size;
  /* A collective that has not finished after this many seconds fails with SHARDOPT_ERR_TIMEOUT
   * naming the operation and rank, instead of hanging. 0 disables the watchdog;
   * NaN and negative values are refused with SHARDOPT_ERR_INVALID_ARGUMENT. */
  double timeout_seconds;
  /* ---- appended later: the size of the earlier struct (through timeout_seconds) is still
   * accepted, and then leaves the field below at its default ---- */
  /* Which ranks form a node (share host memory): 0, those MPI finds on one machine; n > 0,
   * consecutive groups of n of those (CommOptions::ranks_per_node). Negative: refused. */
  int32_t ranks_per_node;
} shardopt_comm_options;

static inline void shardopt_comm_options_init(shardopt_comm_options* options) {
  options->struct_size = sizeof(shardopt_comm_options);
  options->timeout_seconds = 600.0;
  options->ranks_per_node = 0;
}

/* MPI_COMM_WORLD over host memory. Initialises MPI if nobody has; MPI then stays initialised until
 * the process exits, when shardopt finalises it. `options` may be NULL (defaults). */
SHARDOPT_C_API shardopt_status shardopt_comm_world(const shardopt_comm_options* options,
                                                   shardopt_comm_t* out);
/* Borrows the caller's communicator: `mpi_comm` points at an MPI_Comm (so this header needs no
 * mpi.h). MPI must be initialised; shardopt duplicates the communicator and never finalises MPI.
 * Collective over that communicator. */
SHARDOPT_C_API shardopt_status shardopt_comm_borrow(const void* mpi_comm,
                                                    const shardopt_comm_options* options,
                                                    shardopt_comm_t* out);
/* Collective: ranks passing the same color form a new communicator, ordered by key (ties by
 * rank). The new handle is independent of `comm`: destroy each. A rank passing a negative color
 * joins no communicator (MPI_UNDEFINED): it gets SHARDOPT_OK and *out = NULL, which every other
 * function taking a communicator refuses with SHARDOPT_ERR_NULL_POINTER (destroying it is a
 * no-op). */
SHARDOPT_C_API shardopt_status shardopt_comm_split(shardopt_comm_t comm, int color, int key,
                                                   shardopt_comm_t* out);
/* Releases the handle (optimizers created over it keep the communicator alive). NULL is a no-op. */
SHARDOPT_C_API shardopt_status shardopt_comm_destroy(shardopt_comm_t comm);
SHARDOPT_C_API shardopt_status shardopt_comm_rank(shardopt_comm_t comm, int* out);
SHARDOPT_C_API shardopt_status shardopt_comm_size(shardopt_comm_t comm, int* out);
/* Collective. */
SHARDOPT_C_API shardopt_status shardopt_comm_barrier(shardopt_comm_t comm);
/* A NCCL communicator (device buffers), one rank per rank of `mpi_comm` (a pointer to an
 * MPI_Comm; NULL: MPI_COMM_WORLD, initialising MPI if nobody has). Collectives run on `stream`
 * (a cudaStream_t; NULL: one of its own). SHARDOPT_ERR_UNSUPPORTED when this build has no NCCL.
 * Collective over the MPI communicator. */
SHARDOPT_C_API shardopt_status shardopt_comm_nccl(const void* mpi_comm, const shardopt_comm_options* options,
                                                  void* stream, shardopt_comm_t* out);

/* ---- optimizer configuration: shardopt/shardopt_config.h ------------------------------------ */

#include "shardopt/shardopt_config.h"

/* ---- the optimizer ------------------------------------------------------------------------- */

typedef struct shardopt_optimizer_s* shardopt_optimizer_t;

/* Collective over `comm`: every rank registers the same params (names, numels, dtypes, groups)
 * in the same order; a difference fails on every rank with SHARDOPT_ERR_MISMATCH naming the
 * first differing parameter. Params get ids 0, 1, ... in order across the groups. `config` may
 * be NULL (defaults). The optimizer keeps the communicator alive: `comm` may be destroyed first.
 * The arguments keep their first order, config before groups (this signature is part of the
 * ABI): the C++ API's documented constructor takes (comm, groups, config), as Python's
 * shardopt.ZeroOptimizer(comm, groups, config) does, and keeps (comm, config, groups) as well. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_create(shardopt_comm_t comm,
                                                         const shardopt_optimizer_config* config,
                                                         const shardopt_param_group_desc* groups,
                                                         size_t num_groups,
                                                         shardopt_optimizer_t* out);
/* Frees the optimizer, then runs the deleters of the DLPack tensors it owns. NULL is a no-op.
 * While averagers built over it remain (shardopt_model_averager_t, shardopt_post_local_sgd_t),
 * it only retires the handle, and the last of them frees the optimizer. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_destroy(shardopt_optimizer_t opt);

/* Collective. Earlier params keep their ids and state; `out_group` (may be NULL) receives the
 * new group's index. A group whose `hyperparams` is NULL takes the optimizer's defaults
 * (shardopt_optimizer_get_defaults), as torch's add_param_group does. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_add_param_group(shardopt_optimizer_t opt,
                                                                  const shardopt_param_group_desc* group,
                                                                  int32_t* out_group);
SHARDOPT_C_API shardopt_status shardopt_optimizer_num_groups(shardopt_optimizer_t opt, int32_t* out);
SHARDOPT_C_API shardopt_status shardopt_optimizer_num_params(shardopt_optimizer_t opt, int32_t* out);
/* SHARDOPT_ERR_INVALID_ARGUMENT when no param has that name. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_find_param(shardopt_optimizer_t opt, const char* name,
                                                             int32_t* out_id);
/* `out->struct_size` must be set by the caller; the rest is filled in. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_get_hyperparams(shardopt_optimizer_t opt, int32_t group,
                                                                  shardopt_hyperparams* out);
/* The optimizer-level defaults that groups added with NULL hyperparams take (config->defaults,
 * or shardopt_default_hyperparams(algorithm)). `out->struct_size` must be set by the caller. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_get_defaults(shardopt_optimizer_t opt, shardopt_hyperparams* out);
/* Same values on every rank (e.g. an LR schedule); takes effect at the next step. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_set_hyperparams(shardopt_optimizer_t opt, int32_t group,
                                                                  const shardopt_hyperparams* hyper);
/* Same call on every rank. A frozen param is not updated and holds no state; bucket views may
 * move at the next step (see shardopt_optimizer_layout_version). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_set_trainable(shardopt_optimizer_t opt, int32_t id,
                                                                int trainable);
SHARDOPT_C_API shardopt_status shardopt_optimizer_get_trainable(shardopt_optimizer_t opt, int32_t id,
                                                                int* out);
/* Optimizer steps this param has taken. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_step(shardopt_optimizer_t opt, int32_t id,
                                                             int64_t* out);
/* bucket_view: views into shardopt's flat buffers (write gradients into grad_view's buffer);
 * external: the caller's own buffers. At stage 2 with bucket_view there is no gradient buffer to
 * view (SHARDOPT_ERR_INVALID_ARGUMENT): hand gradients with shardopt_optimizer_reduce_gradient. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_view(shardopt_optimizer_t opt, int32_t id,
                                                             shardopt_tensor* out);
SHARDOPT_C_API shardopt_status shardopt_optimizer_grad_view(shardopt_optimizer_t opt, int32_t id,
                                                            shardopt_tensor* out);
/* The same views as DLPack tensors (DLPack 1.x, one dimension, compact, writable) that own a
 * share of the memory they point into: *out stays valid until the caller calls its deleter, also
 * after shardopt_optimizer_set_trainable, _add_param_group or a load has moved the views, or the
 * optimizer was destroyed. Such a kept tensor holds the values of the moment of that change and
 * is no longer the parameter (export again when shardopt_optimizer_layout_version changes).
 * bucket_view storage only (SHARDOPT_ERR_INVALID_ARGUMENT with external storage, whose buffers
 * are the caller's own); the grad export refuses what shardopt_optimizer_grad_view refuses. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_view_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                                    DLManagedTensorVersioned** out);
SHARDOPT_C_API shardopt_status shardopt_optimizer_grad_view_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                                   DLManagedTensorVersioned** out);
/* sorted_greedy: the rank that updates this param; -1 if it straddles ranks or is frozen. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_owner(shardopt_optimizer_t opt, int32_t id,
                                                              int32_t* out);
/* Changes whenever views may have moved: fetch them again when it does. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_layout_version(shardopt_optimizer_t opt, uint64_t* out);

SHARDOPT_C_API shardopt_status shardopt_optimizer_zero_grad(shardopt_optimizer_t opt);
/* Collective: averages gradients over the ranks (skip it if the trainer has its own DDP).
 * Stage 1: a bucketed all-reduce of every gradient. Stage 2: each rank receives only its
 * shard's average; external storage reads the registered gradient buffers, bucket view finishes
 * the round of shardopt_optimizer_reduce_gradient calls (every trainable parameter must have
 * been handed since the last step). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_reduce_gradients(shardopt_optimizer_t opt);
/* Stage 2 (with config.overlap also stage 1), bucket view: hands this rank's local gradient of
 * param `id` (as a backward hook would); `grad` must have the parameter's numel, dtype and device, and is read before the call
 * returns. Collective per bucket: every rank hands the same parameters in the same order, once
 * per step, then calls shardopt_optimizer_reduce_gradients. A call refused on one rank leaves
 * the others waiting for that bucket until the communicator's timeout. Refused with
 * SHARDOPT_ERR_INVALID_ARGUMENT at stage 1 without overlap, with external storage, for a frozen param, a wrong
 * numel/dtype/device or a second hand-over of the same param in one round. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_reduce_gradient(shardopt_optimizer_t opt, int32_t id,
                                                                  const shardopt_tensor* grad);
/* As shardopt_optimizer_reduce_gradient, with the gradient as a DLPack tensor (checked as
 * shardopt_tensor_from_dlpack does). The tensor is consumed: once the call returns SHARDOPT_OK its
 * deleter has run (the values were copied first); when the call fails it stays the caller's. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_reduce_gradient_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                                         DLManagedTensorVersioned* grad);
/* Stage 1, bucket view: the gradient of param `id` in its grad view is final for this round.
 * With config.overlap its bucket's reduction starts once the whole bucket is ready (collective
 * per bucket, like reduce_gradient); without, the call only checks `id`. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_grad_ready(shardopt_optimizer_t opt, int32_t id);
/* config.overlap: return once param `id`'s (bucket `bucket`'s, 0 .. num_buckets-1; every) new
 * values of the last step have landed on this rank. Local; without overlap they return at once.
 * CUDA parameters: the host does not wait; the optimizer's CUDA stream (cuda_stream) waits for
 * the values' gather, so work enqueued on it afterwards sees them. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_wait_param(shardopt_optimizer_t opt, int32_t id);
SHARDOPT_C_API shardopt_status shardopt_optimizer_wait_bucket(shardopt_optimizer_t opt, int32_t bucket);
SHARDOPT_C_API shardopt_status shardopt_optimizer_wait_all(shardopt_optimizer_t opt);
SHARDOPT_C_API shardopt_status shardopt_optimizer_num_buckets(shardopt_optimizer_t opt, int32_t* out);
/* Collective, after reduce_gradients: the total norm (norm_type 2.0, or +infinity (HUGE_VAL)
 * for the max norm) of the averaged, unscaled gradients over all ranks' shards, as
 * torch.nn.utils.clip_grad_norm_ returns it (NaN if a gradient is inf or NaN). The next step
 * multiplies the gradients by max_norm / (norm + 1e-6), capped at 1 (the gradient buffers keep
 * their values). `out_norm` may be NULL. SHARDOPT_ERR_INVALID_ARGUMENT for another norm_type or
 * a max_norm that is negative or not finite. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_clip_grad_norm(shardopt_optimizer_t opt, double max_norm,
                                                                 double norm_type, double* out_norm);
/* Loss scaling: the factor to multiply the loss by before backward (1 when it is disabled). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_loss_scale(shardopt_optimizer_t opt, double* out);
/* Sets the scale (e.g. when resuming) and restarts the growth count; same value on every rank.
 * SHARDOPT_ERR_INVALID_ARGUMENT when loss scaling is disabled or `scale` is not finite and > 0. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_set_loss_scale(shardopt_optimizer_t opt, double scale);
/* Collective: updates this rank's shard, then syncs parameters to every rank. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_step(shardopt_optimizer_t opt);
/* Collective: shardopt_optimizer_step, except that the `count` params in `ids` sit this step out
 * (no update, no state or step-count change; their gradient buffers are not read), as torch's
 * optimizers skip a param whose .grad is None. ZeroOptimizer::step(without_grad) in
 * shardopt/optimizer.hpp. Every rank names the same params (in any order; repeats count once),
 * or the step fails on every rank with SHARDOPT_ERR_MISMATCH. `ids` may be NULL when `count` is
 * 0 (a plain step). An id out of range, a negative `count`, NULL `ids` with `count` > 0, or any
 * `count` > 0 with config.overlap = per_bucket fails on every rank (SHARDOPT_ERR_INVALID_ARGUMENT;
 * SHARDOPT_ERR_NULL_POINTER on the rank that passed NULL) and steps nothing. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_step_without(shardopt_optimizer_t opt, const int32_t* ids,
                                                               int64_t count);
/* Collective, for a rank out of inputs (uneven inputs): until every rank has joined, follows the
 * other ranks' gradient reductions, clipping and steps with zero gradients and its own shard's
 * update, so they can go on; returns once every rank has joined. Any other collective call while
 * a rank is joined fails with SHARDOPT_ERR_INVALID_ARGUMENT on every rank. See
 * ZeroOptimizer::join() in shardopt/optimizer.hpp. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_join(shardopt_optimizer_t opt);
/* Collective: one pass of shardopt_optimizer_join, for trainers whose own join loop calls a hook
 * once per iteration (torch's Join): follows the active ranks' calls up to and including one
 * step and sets *shadowed_a_step to 1, or sets it to 0 once every rank is in join_step or join
 * (then every rank holds the same parameters); a failed call sets it to 0. `shadowed_a_step` may
 * be NULL (refusing it on one rank alone would leave the others in the collective). Errors as shardopt_optimizer_join's:
 * another collective call of the active ranks fails with SHARDOPT_ERR_INVALID_ARGUMENT on every
 * rank, naming it and the joined rank. ZeroOptimizer::join_step() in shardopt/optimizer.hpp. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_join_step(shardopt_optimizer_t opt, int* shadowed_a_step);
/* What the last step did. `out->struct_size` must be set by the caller (shardopt_step_report_init). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_last_step(shardopt_optimizer_t opt, shardopt_step_report* out);
/* CUDA parameters: the cudaStream_t (as void*) all of the optimizer's device work runs on;
 * order gradient writes before reduce_gradients/step, and parameter reads after, against it.
 * NULL for CPU parameters. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_cuda_stream(shardopt_optimizer_t opt, void** out);
/* `out->struct_size` must be set by the caller (shardopt_memory_report_init). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_memory_report(shardopt_optimizer_t opt,
                                                                shardopt_memory_report* out);

/* ---- checkpoints --------------------------------------------------------------------------- */

/* Collective: each rank writes its shard into `dir` (created if needed), rank 0 the manifest
 * last, atomically; a failed save leaves the previous checkpoint in `dir` loadable. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_save(shardopt_optimizer_t opt, const char* dir);
/* Collective: the checkpoint save(dir) would write now, written by a background thread while
 * training goes on (ZeroOptimizer::save_async). Steps first wait until the writer has read the
 * state; the checkpoint is committed only by shardopt_optimizer_wait_save (or the next save,
 * save_async or load, which complete a pending one first); until then, and after any crash,
 * the previous checkpoint in `dir` is the one a load finds. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_save_async(shardopt_optimizer_t opt, const char* dir);
/* Collective: completes the pending save_async (none: returns at once): the ranks agree on
 * their files and rank 0 commits the manifest; a failure on any rank fails on every rank with
 * save's message, the previous checkpoint intact. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_wait_save(shardopt_optimizer_t opt);
/* Collective: validates the checkpoint in `dir` before changing anything, then restores state,
 * steps, hyperparameters, trainable flags and parameter values (resharding as needed). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_load(shardopt_optimizer_t opt, const char* dir);
/* Collective: gathers the whole optimizer state on rank `to` (torch's consolidate_state_dict).
 * Rank `to` then reads it with shardopt_optimizer_state_dict (shardopt/shardopt_state_dict.h). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_consolidate_state_dict(shardopt_optimizer_t opt, int to);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Model averaging and post-local SGD over these optimizers: a header of its own, part of the
 * whole C ABI that including this one gives. */
#include "shardopt/shardopt_averaging.h"
/* Collectives on a communicator handle, and the consolidated state dict read from C. */
#include "shardopt/shardopt_collectives.h"
#include "shardopt/shardopt_state_dict.h"

#endif /* SHARDOPT_SHARDOPT_H_ */
