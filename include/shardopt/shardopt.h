/* shardopt/shardopt.h — the C ABI: opaque handles, config structs led by struct_size, status codes; nothing throws across it. */
#ifndef SHARDOPT_SHARDOPT_H_
#define SHARDOPT_SHARDOPT_H_

/* Conventions (every function below follows them):
 *  - Each function returns a shardopt_status. On failure shardopt_last_error() holds a message
 *    naming the function and what was wrong (parameter, rank, file); it is per thread and stays
 *    valid until the next shardopt_* call on that thread. A successful call clears it to "".
 *  - Structs passed in or filled out begin with `size_t struct_size`, set by the caller to
 *    sizeof(the struct) as its header declared it (the shardopt_*_init helpers do that). The
 *    library refuses a size it does not know with SHARDOPT_ERR_STRUCT_SIZE, so a program built
 *    against another version of this header fails cleanly instead of reading past a struct.
 *  - Handles are checked: a destroyed, never-created or wrong-kind handle gives
 *    SHARDOPT_ERR_BAD_HANDLE (without being dereferenced); NULL gives SHARDOPT_ERR_NULL_POINTER,
 *    as does any other NULL pointer argument, except for the destroy functions (a no-op).
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
  SHARDOPT_ERR_INTERNAL = 9,     /* a bug in shardopt, or out of memory */
  SHARDOPT_ERR_BAD_HANDLE = 10,  /* destroyed, never created, or the wrong kind of handle */
  SHARDOPT_ERR_NULL_POINTER = 11,
  SHARDOPT_ERR_STRUCT_SIZE = 12  /* struct_size is not one this library knows */
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
  SHARDOPT_DTYPE_F16 = 2
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
   * naming the operation and rank, instead of hanging. <= 0 disables the watchdog. */
  double timeout_seconds;
} shardopt_comm_options;

static inline void shardopt_comm_options_init(shardopt_comm_options* options) {
  options->struct_size = sizeof(shardopt_comm_options);
  options->timeout_seconds = 600.0;
}

/* MPI_COMM_WORLD over host memory. Initialises MPI if nobody has, and finalises it when the last
 * communicator that owns it is destroyed. `options` may be NULL (defaults). */
SHARDOPT_C_API shardopt_status shardopt_comm_world(const shardopt_comm_options* options,
                                                   shardopt_comm_t* out);
/* Borrows the caller's communicator: `mpi_comm` points at an MPI_Comm (so this header needs no
 * mpi.h). MPI must be initialised; shardopt duplicates the communicator and never finalises MPI.
 * Collective over that communicator. */
SHARDOPT_C_API shardopt_status shardopt_comm_borrow(const void* mpi_comm,
                                                    const shardopt_comm_options* options,
                                                    shardopt_comm_t* out);
/* Collective: ranks passing the same color form a new communicator, ordered by key (ties by
 * rank). The new handle is independent of `comm`: destroy each. */
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
} shardopt_optimizer_config;

static inline void shardopt_optimizer_config_init(shardopt_optimizer_config* config) {
  config->struct_size = sizeof(shardopt_optimizer_config);
  config->algorithm = SHARDOPT_ALGORITHM_ADAM;
  config->partition = SHARDOPT_PARTITION_FLAT;
  config->storage = SHARDOPT_STORAGE_BUCKET_VIEW;
  config->shard_state = 1;
  config->bucket_bytes = (int64_t)64 << 20;
  config->threads = 0;
}

/* Per-group hyperparameters with torch.optim's names and defaults; changeable between steps. */
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

/* A param group: its parameters and hyperparameters (NULL: torch's defaults). */
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

typedef struct shardopt_memory_report {
  size_t struct_size;
  int64_t state_bytes;        /* optimizer state held by this rank */
  int64_t param_buffer_bytes; /* flat parameter buffer (bucket view) or sync staging */
  int64_t grad_buffer_bytes;  /* flat gradient buffer (bucket view) or reduce staging */
  int64_t shard_numel;        /* elements this rank updates */
  int64_t trainable_numel;    /* trainable elements over all ranks */
} shardopt_memory_report;

/* ---- the optimizer ------------------------------------------------------------------------- */

typedef struct shardopt_optimizer_s* shardopt_optimizer_t;

/* Collective over `comm`: every rank registers the same params (names, numels, dtypes, groups)
 * in the same order; a difference fails on every rank with SHARDOPT_ERR_MISMATCH naming the
 * first differing parameter. Params get ids 0, 1, ... in order across the groups. `config` may
 * be NULL (defaults). The optimizer keeps the communicator alive: `comm` may be destroyed first. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_create(shardopt_comm_t comm,
                                                         const shardopt_optimizer_config* config,
                                                         const shardopt_param_group_desc* groups,
                                                         size_t num_groups,
                                                         shardopt_optimizer_t* out);
/* Frees the optimizer, then runs the deleters of the DLPack tensors it owns. NULL is a no-op. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_destroy(shardopt_optimizer_t opt);

/* Collective. Earlier params keep their ids and state; `out_group` (may be NULL) receives the
 * new group's index. */
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
 * external: the caller's own buffers. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_view(shardopt_optimizer_t opt, int32_t id,
                                                             shardopt_tensor* out);
SHARDOPT_C_API shardopt_status shardopt_optimizer_grad_view(shardopt_optimizer_t opt, int32_t id,
                                                            shardopt_tensor* out);
/* sorted_greedy: the rank that updates this param; -1 if it straddles ranks or is frozen. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_param_owner(shardopt_optimizer_t opt, int32_t id,
                                                              int32_t* out);
/* Changes whenever views may have moved: fetch them again when it does. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_layout_version(shardopt_optimizer_t opt, uint64_t* out);

SHARDOPT_C_API shardopt_status shardopt_optimizer_zero_grad(shardopt_optimizer_t opt);
/* Collective: averages gradients over the ranks (skip it if the trainer has its own DDP). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_reduce_gradients(shardopt_optimizer_t opt);
/* Collective: updates this rank's shard, then syncs parameters to every rank. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_step(shardopt_optimizer_t opt);
/* CUDA parameters: the cudaStream_t (as void*) all of the optimizer's device work runs on;
 * order gradient writes before reduce_gradients/step, and parameter reads after, against it.
 * NULL for CPU parameters. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_cuda_stream(shardopt_optimizer_t opt, void** out);
/* `out->struct_size` must be set by the caller. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_memory_report(shardopt_optimizer_t opt,
                                                                shardopt_memory_report* out);

/* ---- checkpoints --------------------------------------------------------------------------- */

/* Collective: each rank writes its shard into `dir` (created if needed), rank 0 the manifest
 * last, atomically; a failed save leaves the previous checkpoint in `dir` loadable. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_save(shardopt_optimizer_t opt, const char* dir);
/* Collective: validates the checkpoint in `dir` before changing anything, then restores state,
 * steps, hyperparameters, trainable flags and parameter values (resharding as needed). */
SHARDOPT_C_API shardopt_status shardopt_optimizer_load(shardopt_optimizer_t opt, const char* dir);
/* Collective: gathers the whole optimizer state on rank `to` (torch's consolidate_state_dict).
 * The consolidated dict itself is reachable from C++ and Python (state_dict()), not from C. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_consolidate_state_dict(shardopt_optimizer_t opt, int to);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDOPT_SHARDOPT_H_ */
