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

/* ---- optimizer configuration --------------------------------------------------------------- */

typedef enum shardopt_algorithm {
  SHARDOPT_ALGORITHM_SGD = 0,
  SHARDOPT_ALGORITHM_ADAM = 1,
  SHARDOPT_ALGORITHM_ADAMW = 2
} shardopt_algorithm;

typedef enum shardopt_partition {
  SHARDOPT_PARTITION_FLAT = 0,          /* contiguous 1/N of all trainable elements per rank */
  SHARDOPT_PARTITION_SORTED_GREEDY = 1  /* whole params per rank, as torch's ZeroRedundancyOptimizer */
} shardopt_partition;

typedef enum shardopt_storage {
  SHARDOPT_STORAGE_BUCKET_VIEW = 0, /* shardopt owns flat param/grad buffers; use the view functions */
  SHARDOPT_STORAGE_EXTERNAL = 1     /* the caller's buffers stay put; shardopt copies to/from them */
} shardopt_storage;

/* config.overlap: see OverlapPolicy in shardopt/optimizer.hpp. */
typedef enum shardopt_overlap_policy {
  SHARDOPT_OVERLAP_OFF = 0,            /* reduce_gradients and step do all their work inside the call */
  SHARDOPT_OVERLAP_AFTER_BACKWARD = 1, /* reductions overlap backward; all-gathers the next forward */
  SHARDOPT_OVERLAP_PER_BUCKET = 2      /* each bucket updated and gathered once reduced (no clipping) */
} shardopt_overlap_policy;

/* Dynamic loss scaling for f16 gradients, with torch.cuda.amp.GradScaler's parameters and rules:
 * the caller multiplies the loss by shardopt_optimizer_loss_scale() before backward; a step whose
 * gradients hold an inf or NaN on any rank is skipped on every rank (no parameter, state or step
 * count changes) and the scale is multiplied by backoff_factor (never below min_scale); after
 * growth_interval clean steps in a row it is multiplied by growth_factor. Embedded in
 * shardopt_optimizer_config; like shardopt_tensor this struct is frozen and has no struct_size. */
typedef struct shardopt_loss_scaling {
  int32_t enabled;         /* boolean; 0: the scale is 1 and the fields below are ignored */
  double init_scale;       /* finite, > 0 */
  double growth_factor;    /* finite, > 1 */
  double backoff_factor;   /* in (0, 1) */
  int64_t growth_interval; /* > 0 */
  double min_scale;        /* finite, > 0, <= init_scale */
} shardopt_loss_scaling;

/* Per-group hyperparameters with torch.optim's names; changeable between steps. */
typedef struct shardopt_hyperparams {
  size_t struct_size;
  double lr;
  double beta1; /* Adam/AdamW */
  double beta2;
  double eps;
  double weight_decay; /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
  double momentum;     /* SGD */
  double dampening;
  int32_t nesterov; /* booleans: 0 or 1 */
  int32_t maximize;
  int32_t amsgrad;
} shardopt_hyperparams;

/* torch's Adam/SGD defaults (weight_decay 0). For another algorithm's own defaults (AdamW's
 * weight_decay is 0.01), use shardopt_default_hyperparams instead. */
static inline void shardopt_hyperparams_init(shardopt_hyperparams* hyper) {
  hyper->struct_size = sizeof(shardopt_hyperparams);
  hyper->lr = 1e-3;
  hyper->beta1 = 0.9;
  hyper->beta2 = 0.999;
  hyper->eps = 1e-8;
  hyper->weight_decay = 0.0;
  hyper->momentum = 0.0;
  hyper->dampening = 0.0;
  hyper->nesterov = 0;
  hyper->maximize = 0;
  hyper->amsgrad = 0;
}

/* torch.optim's constructor defaults for `algorithm` (SGD, Adam: as shardopt_hyperparams_init;
 * AdamW: weight_decay 0.01): what groups take when neither they nor the config set any.
 * `out->struct_size` must be set by the caller; the rest is filled in. */
SHARDOPT_C_API shardopt_status shardopt_default_hyperparams(shardopt_algorithm algorithm,
                                                            shardopt_hyperparams* out);

typedef struct shardopt_optimizer_config {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  /* 0: every rank keeps the full state and updates everything (the unsharded baseline). */
  int32_t shard_state;
  /* Largest single collective of reduce_gradients and of the parameter sync. */
  int64_t bucket_bytes;
  /* Threads of the CPU update; 0 leaves the OpenMP default. */
  int32_t threads;
  /* ---- appended later: the size of the earlier struct (through `threads`) is still accepted,
   * and then leaves the fields below at their defaults ---- */
  /* 1: ZeRO-1, gradients are averaged whole on every rank (all-reduce). 2: ZeRO-2, each rank
   * receives only its shard's averaged gradients and keeps gradient memory for its shard only
   * (needs shard_state = 1); with bucket-view storage the gradients are handed one parameter
   * at a time with shardopt_optimizer_reduce_gradient instead of written into grad views. */
  int32_t stage;
  /* bf16/f16 parameters: how the updated fp32 master copy is written back into the parameter.
   * 0: round to nearest even. 1: stochastic rounding, drawn from a counter-based hash of
   * (rounding_seed, step, element): reproducible, and independent of the world size. */
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  /* ---- appended later: the sizes of the earlier structs (through `threads`, through
   * `loss_scaling`) are still accepted, and then leave the fields below at their defaults ---- */
  /* The optimizer-level hyperparameters (torch's `defaults`): what a group whose `hyperparams`
   * is NULL takes, at create and in add_param_group. NULL: shardopt_default_hyperparams(algorithm),
   * torch's constructor defaults (AdamW: weight_decay 0.01). Read during create, not kept. */
  const shardopt_hyperparams* defaults;
  /* ---- appended later: the sizes of the earlier structs (through `threads`, `loss_scaling`,
   * `defaults`) are still accepted, and then leave the fields below at their defaults ---- */
  /* 1 (default): with bucket-view storage, CPU parameters and sharded state, the ranks of a node
   * map one parameter buffer (one copy per node); the sync within a node is a barrier. Results
   * are bitwise those of 0. A write through a parameter view is seen by the node's other ranks.
   * See OptimizerConfig::node_shared_params in shardopt/optimizer.hpp. */
  int32_t node_shared_params;
  /* ---- appended later: the sizes of the earlier structs (through `threads`, `loss_scaling`,
   * `defaults`, `node_shared_params`) are still accepted, and then leave this at its default ---- */
  /* > 0 (bucket view, sharded): the step updates the shard in chunks of this many bytes and
   * starts each chunk's sync while the next is updated; 0 (default): update, then sync. */
  int64_t pipeline_chunk_bytes;
  /* ---- appended later: the sizes of the earlier structs (through `pipeline_chunk_bytes`) are
   * still accepted, and then leave this at its default ---- */
  /* Join (shardopt_optimizer_join): 0 (default) divides the gradient sum by the ranks still
   * active, 1 by the world size (DDP's divide_by_initial_world_size). */
  int32_t divide_by_initial_world_size;
  /* ---- appended later: the sizes of the earlier structs (through
   * `divide_by_initial_world_size`) are still accepted, and then leave this at its default ---- */
  /* SHARDOPT_OVERLAP_OFF (default), or overlap the step with backward and the next forward:
   * hand gradients with shardopt_optimizer_grad_ready / shardopt_optimizer_reduce_gradient as
   * backward produces them, and wait with shardopt_optimizer_wait_param before reading a
   * parameter after a step. Bucket-view storage; MPI must provide MPI_THREAD_SERIALIZED. CUDA
   * parameters over NCCL (or one rank): wait_param orders the optimizer's CUDA stream after the
   * parameter's gather instead of blocking the host. See OptimizerConfig::overlap in
   * shardopt/optimizer.hpp. A
   * shardopt_overlap_policy value, held in 64 bits: a 32-bit field would sit in the earlier
   * struct's tail padding and leave the struct's size, which tells the versions apart, as it was. */
  int64_t overlap;
} shardopt_optimizer_config;

static inline void shardopt_optimizer_config_init(shardopt_optimizer_config* config) {
  config->struct_size = sizeof(shardopt_optimizer_config);
  config->algorithm = SHARDOPT_ALGORITHM_ADAM;
  config->partition = SHARDOPT_PARTITION_FLAT;
  config->storage = SHARDOPT_STORAGE_BUCKET_VIEW;
  config->shard_state = 1;
  config->bucket_bytes = (int64_t)4 << 20;
  config->threads = 0;
  config->stage = 1;
  config->stochastic_rounding = 0;
  config->rounding_seed = 0;
  config->loss_scaling.enabled = 0;
  config->loss_scaling.init_scale = 65536.0;
  config->loss_scaling.growth_factor = 2.0;
  config->loss_scaling.backoff_factor = 0.5;
  config->loss_scaling.growth_interval = 2000;
  config->loss_scaling.min_scale = 1.0;
  config->defaults = NULL;
  config->node_shared_params = 1;
  config->pipeline_chunk_bytes = 0;
  config->divide_by_initial_world_size = 0;
  config->overlap = SHARDOPT_OVERLAP_OFF;
}

/* One parameter. Describe its buffers either raw (`param`, `grad`) or as DLPack tensors
 * (`param_dlpack`, `grad_dlpack`), not both for the same buffer.
 *  - bucket_view storage: `param` (or `param_dlpack`) gives numel, dtype, device and the initial
 *    values (param.data may be NULL for zeros); leave the gradient empty: shardopt owns it.
 *  - external storage: the caller's parameter and gradient buffers, which must outlive the
 *    optimizer.
 * A DLPack tensor is owned by the optimizer once the call that received it returns SHARDOPT_OK:
 * its deleter runs exactly once, when the optimizer is destroyed. When the call fails it stays
 * the caller's (whose deleter is then the caller's to call). */
typedef struct shardopt_param_desc {
  size_t struct_size;
  const char* name; /* unique; copied */
  shardopt_tensor param;
  shardopt_tensor grad;
  DLManagedTensorVersioned* param_dlpack;
  DLManagedTensorVersioned* grad_dlpack;
} shardopt_param_desc;

static inline void shardopt_param_desc_init(shardopt_param_desc* desc) {
  const shardopt_tensor empty = {NULL, 0, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  desc->struct_size = sizeof(shardopt_param_desc);
  desc->name = NULL;
  desc->param = empty;
  desc->grad = empty;
  desc->param_dlpack = NULL;
  desc->grad_dlpack = NULL;
}

/* A param group: its parameters and hyperparameters. `hyperparams` NULL: the optimizer's defaults
 * (shardopt_optimizer_config.defaults, or torch's for the algorithm), as a torch param group that
 * sets no hyperparameter key; otherwise every field of *hyperparams is the group's own. */
typedef struct shardopt_param_group_desc {
  size_t struct_size;
  const shardopt_param_desc* params;
  size_t num_params;
  const shardopt_hyperparams* hyperparams;
} shardopt_param_group_desc;

static inline void shardopt_param_group_desc_init(shardopt_param_group_desc* desc) {
  desc->struct_size = sizeof(shardopt_param_group_desc);
  desc->params = NULL;
  desc->num_params = 0;
  desc->hyperparams = NULL;
}

/* Bytes this rank holds, per component. */
typedef struct shardopt_memory_report {
  size_t struct_size;
  int64_t state_bytes;        /* optimizer state (exp_avg, exp_avg_sq, momentum, ...) */
  int64_t param_buffer_bytes; /* the first header's totals: param_bytes */
  int64_t grad_buffer_bytes;  /* and grad_bytes + buffer_bytes (all staging) */
  int64_t shard_numel;        /* elements this rank updates */
  int64_t trainable_numel;    /* trainable elements over all ranks */
  /* ---- appended later: the size of the earlier struct (through trainable_numel) is still
   * accepted, and then these are not written ---- */
  int64_t master_bytes; /* fp32 master copies of this rank's shard (bf16/f16 parameters) */
  int64_t param_bytes;  /* parameters shardopt owns (bucket view: the flat buffer) */
  int64_t grad_bytes;   /* gradients shardopt owns (stage 2: this rank's shard only) */
  int64_t buffer_bytes; /* staging for the parameter sync and the gradient reduction */
  /* ---- appended later: the sizes of the earlier structs are still accepted ---- */
  /* node_shared_params: the parameter buffer this rank maps with node_ranks - 1 others of its
   * node, one copy per node (param_bytes is then 0); node_ranks is 1 without sharing. */
  int64_t node_shared_param_bytes;
  int32_t node_ranks;
} shardopt_memory_report;

static inline void shardopt_memory_report_init(shardopt_memory_report* report) {
  report->struct_size = sizeof(shardopt_memory_report);
  report->state_bytes = 0;
  report->param_buffer_bytes = 0;
  report->grad_buffer_bytes = 0;
  report->shard_numel = 0;
  report->trainable_numel = 0;
  report->master_bytes = 0;
  report->param_bytes = 0;
  report->grad_bytes = 0;
  report->buffer_bytes = 0;
  report->node_shared_param_bytes = 0;
  report->node_ranks = 1;
}

/* What the last shardopt_optimizer_step did (before the first step: skipped 0, loss_scale 1,
 * grad_norm -1, clip_coef 1, skipped_steps 0). */
typedef struct shardopt_step_report {
  size_t struct_size;
  int32_t skipped;       /* boolean: loss scaling found an inf/NaN gradient on some rank */
  double loss_scale;     /* the scale the step's gradients carried (1 without loss scaling) */
  double grad_norm;      /* total norm from clip_grad_norm before the step; -1 if not called */
  double clip_coef;      /* factor clipping applied to the (unscaled) gradients; 1 if none */
  int64_t skipped_steps; /* steps skipped since the optimizer was created */
  /* ---- appended later: the size of the earlier struct (through skipped_steps) is still
   * accepted, and then these are not written ---- */
  /* Wall time of the step's phases on this rank, in seconds (StepReport in optimizer.hpp): the
   * agreement at its start, the update, the parameter sync. 0 before the first step. */
  double agree_seconds;
  double update_seconds;
  double sync_seconds;
} shardopt_step_report;

static inline void shardopt_step_report_init(shardopt_step_report* report) {
  report->struct_size = sizeof(shardopt_step_report);
  report->skipped = 0;
  report->loss_scale = 1.0;
  report->grad_norm = -1.0;
  report->clip_coef = 1.0;
  report->skipped_steps = 0;
  report->agree_seconds = 0.0;
  report->update_seconds = 0.0;
  report->sync_seconds = 0.0;
}

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
