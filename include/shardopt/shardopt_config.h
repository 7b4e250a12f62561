/* shardopt/shardopt_config.h — the C ABI's optimizer configuration: algorithms, partitions, storage and overlap, hyperparameters, the config struct, parameter and group descriptions, and the memory and step reports. Included by shardopt/shardopt.h; its conventions hold here. */
/* (shardopt.h first, outside the guard: it includes this file where these types belong.) */
#include "shardopt/shardopt.h"

#ifndef SHARDOPT_SHARDOPT_CONFIG_H_
#define SHARDOPT_SHARDOPT_CONFIG_H_

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizer configuration --------------------------------------------------------------- */

typedef enum shardopt_algorithm {
  SHARDOPT_ALGORITHM_SGD = 0,
  SHARDOPT_ALGORITHM_ADAM = 1,
  SHARDOPT_ALGORITHM_ADAMW = 2,
  SHARDOPT_ALGORITHM_MUON = 3 /* torch.optim.Muon: 2-D parameters (shardopt_param_desc.shape), each owned whole */
} shardopt_algorithm;

/* Muon's adjust_lr_fn (torch.optim.Muon's names): see MuonLrAdjust in shardopt/optimizer.hpp. */
typedef enum shardopt_muon_lr_adjust {
  SHARDOPT_MUON_LR_ADJUST_NONE = 0,
  SHARDOPT_MUON_LR_ADJUST_ORIGINAL = 1,
  SHARDOPT_MUON_LR_ADJUST_MATCH_RMS_ADAMW = 2,
  SHARDOPT_MUON_LR_ADJUST_SPECTRAL_UNCLAMPED = 3
} shardopt_muon_lr_adjust;

/* The arithmetic of Muon's Newton-Schulz: see MatrixPrecision in shardopt/optimizer.hpp. */
typedef enum shardopt_matrix_precision {
  SHARDOPT_MATRIX_PRECISION_BF16 = 0, /* as torch.optim.Muon */
  SHARDOPT_MATRIX_PRECISION_F32 = 1
} shardopt_matrix_precision;

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

/* How the param groups keep Adam's moments and bf16 masters (docs/compact_state.md). */
typedef enum shardopt_state_precision {
  SHARDOPT_STATE_PRECISION_FP32 = 0, /* fp32 moments */
  SHARDOPT_STATE_PRECISION_Q8 = 1    /* 8-bit blockwise moments (Adam/AdamW, sorted_greedy partition) */
} shardopt_state_precision;
typedef enum shardopt_master_storage {
  SHARDOPT_MASTER_FP32 = 0,       /* an fp32 copy of each bf16/f16 parameter */
  SHARDOPT_MASTER_REMAINDER16 = 1 /* bf16 only: the parameter and a 16-bit remainder */
} shardopt_master_storage;

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
  /* ---- appended later (Muon): the size of the earlier struct (through `amsgrad`) is still
   * accepted; it then reads as these defaults and is written without them ---- */
  double ns_coefficients[3]; /* (3.4445, -4.775, 2.0315) */
  int32_t ns_steps;          /* 5 */
  int32_t adjust_lr_fn;      /* a shardopt_muon_lr_adjust; NONE */
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
  hyper->ns_coefficients[0] = 3.4445;
  hyper->ns_coefficients[1] = -4.775;
  hyper->ns_coefficients[2] = 2.0315;
  hyper->ns_steps = 5;
  hyper->adjust_lr_fn = SHARDOPT_MUON_LR_ADJUST_NONE;
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
  /* ---- appended later: the sizes of the earlier structs (through `overlap`) are still
   * accepted, and then leave these at their defaults ---- */
  /* Muon's Newton-Schulz: a shardopt_matrix_precision (BF16, the default, as torch), and the
   * OpenBLAS threads of each product (1 by default; fixed, so the bits never depend on it). */
  int32_t muon_precision;
  int32_t muon_blas_threads;
  /* ---- appended later: the sizes of the earlier structs (through `muon_blas_threads`) are
   * still accepted, and then leave these at their defaults ---- */
  /* Every param group's compact state (shardopt_state_precision, shardopt_master_storage values;
   * default 0: fp32 moments and fp32 masters). See OptimizerConfig::state_precision and ::master. */
  int32_t state_precision;
  int32_t master;
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
  config->muon_precision = SHARDOPT_MATRIX_PRECISION_BF16;
  config->muon_blas_threads = 1;
  config->state_precision = SHARDOPT_STATE_PRECISION_FP32;
  config->master = SHARDOPT_MASTER_FP32;
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
  /* ---- appended later: the size of the earlier struct (through `grad_dlpack`) is still
   * accepted, and then means no shape ---- */
  /* The parameter's shape, row-major: `ndim` sizes at `shape` (copied); ndim 0: 1-D of numel.
   * A Muon group's parameters need ndim 2. */
  const int64_t* shape;
  int64_t ndim;
} shardopt_param_desc;

static inline void shardopt_param_desc_init(shardopt_param_desc* desc) {
  const shardopt_tensor empty = {NULL, 0, SHARDOPT_DTYPE_F32, SHARDOPT_DEVICE_CPU, 0};
  desc->struct_size = sizeof(shardopt_param_desc);
  desc->name = NULL;
  desc->param = empty;
  desc->grad = empty;
  desc->param_dlpack = NULL;
  desc->grad_dlpack = NULL;
  desc->shape = NULL;
  desc->ndim = 0;
}

/* A param group: its parameters and hyperparameters. `hyperparams` NULL: the optimizer's defaults
 * (shardopt_optimizer_config.defaults, or torch's for the algorithm), as a torch param group that
 * sets no hyperparameter key; otherwise every field of *hyperparams is the group's own. */
typedef struct shardopt_param_group_desc {
  size_t struct_size;
  const shardopt_param_desc* params;
  size_t num_params;
  const shardopt_hyperparams* hyperparams;
  /* ---- appended later: the size of the earlier struct (through `hyperparams`) is still
   * accepted, and then means the config's algorithm ---- */
  /* The group's algorithm for its whole life (a shardopt_algorithm), or -1: the config's. */
  int64_t algorithm;
} shardopt_param_group_desc;

static inline void shardopt_param_group_desc_init(shardopt_param_group_desc* desc) {
  desc->struct_size = sizeof(shardopt_param_group_desc);
  desc->params = NULL;
  desc->num_params = 0;
  desc->hyperparams = NULL;
  desc->algorithm = -1;
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
  /* ---- appended later: the size of the earlier struct (through sync_seconds) is still
   * accepted, and then this is not written ---- */
  /* Of update_seconds, the part spent in Muon's Newton-Schulz orthogonalisations on this rank
   * (0 without Muon groups, on a rank that owns no Muon matrix, or on a CUDA device). */
  double newton_schulz_seconds;
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
  report->newton_schulz_seconds = 0.0;
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* SHARDOPT_SHARDOPT_CONFIG_H_ */
