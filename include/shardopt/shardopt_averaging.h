/* shardopt/shardopt_averaging.h — the C ABI of model averaging (local SGD): averager and post-local-SGD handles over an optimizer, their config and communication counts. Included by shardopt/shardopt.h; its conventions hold here. */
#ifndef SHARDOPT_SHARDOPT_AVERAGING_H_
#define SHARDOPT_SHARDOPT_AVERAGING_H_

#include "shardopt/shardopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model averaging (local SGD) ----------------------------------------------------------- */

/* See shardopt/averaging.hpp for the algorithm; the C functions below wrap ModelAverager and
 * PostLocalSGDOptimizer one for one. A replica is one optimizer: its communicator groups L ranks
 * of a larger "world" communicator (e.g. the ranks of a node, or one rank each for plain local
 * SGD, with shardopt_comm_split), and every `period` steps the replicas average their
 * parameters over the world, or hierarchically over groups of replicas. */

/* One level of averaging: every `period` steps (after warmup) the replicas in each group of
 * `group_size` consecutive world ranks average their parameters; group_size 0 is the whole world.
 * Frozen (embedded in arrays), so it carries no struct_size. */
typedef struct shardopt_averaging_level {
  int64_t period;
  int32_t group_size;
} shardopt_averaging_level;

/* The outer optimizer (DiLoCo) of the world-level averaging: torch's SGD (dampening 0, no weight
 * decay) applied to the pseudo-gradient (params at the last sync) - (average of the replicas).
 * Embedded in shardopt_averager_config; frozen like shardopt_loss_scaling. */
typedef struct shardopt_outer_optimizer {
  int32_t enabled; /* boolean; 0: the plain average, and the fields below are ignored */
  double lr;
  double momentum;
  int32_t nesterov; /* boolean */
} shardopt_outer_optimizer;

typedef struct shardopt_averager_config {
  size_t struct_size;
  /* Increasing periods with increasing group sizes, the last group the world: one level
   * {period, 0} is torch's PeriodicModelAverager(period), several its HierarchicalModelAverager.
   * Read during create, not kept. */
  const shardopt_averaging_level* levels;
  size_t num_levels;
  /* Averaging starts at this step; during it PostLocalSGD averages gradients over the world. */
  int64_t warmup_steps;
  /* boolean: count periods from step 0 (HierarchicalModelAverager) instead of from the end of
   * warmup (PeriodicModelAverager), as torch's two averagers do. */
  int32_t hierarchical;
  /* Largest single collective of the averaging. */
  int64_t bucket_bytes;
  shardopt_outer_optimizer outer;
} shardopt_averager_config;

/* torch's PeriodicModelAverager defaults, without levels: set `levels` and `num_levels`. */
static inline void shardopt_averager_config_init(shardopt_averager_config* config) {
  config->struct_size = sizeof(shardopt_averager_config);
  config->levels = NULL;
  config->num_levels = 0;
  config->warmup_steps = 0;
  config->hierarchical = 0;
  config->bucket_bytes = (int64_t)4 << 20;
  config->outer.enabled = 0;
  config->outer.lr = 0.7;
  config->outer.momentum = 0.9;
  config->outer.nesterov = 1;
}

/* What a rank has handed to collectives spanning more than one rank, in bytes of payload. */
typedef struct shardopt_communication_counts {
  size_t struct_size;
  /* gradient averaging (post-local SGD only): across the replicas in warmup, plus the
   * replica's own reduction when it has several ranks */
  int64_t gradient_bytes;
  int64_t averaging_bytes; /* parameter averaging, and the outer optimizer's */
  /* average_parameters() calls on an averaging step (a level of one replica, which sends
   * nothing, included) */
  int64_t averages;
} shardopt_communication_counts;

static inline void shardopt_communication_counts_init(shardopt_communication_counts* counts) {
  counts->struct_size = sizeof(shardopt_communication_counts);
  counts->gradient_bytes = 0;
  counts->averaging_bytes = 0;
  counts->averages = 0;
}

/* Both kinds of handle below keep their optimizer alive: shardopt_optimizer_destroy may come
 * first (it then retires the optimizer's handle, and the last of them frees the optimizer), as
 * may shardopt_comm_destroy of `world`. */

/* ---- a model averager: average_parameters() after the optimizer's step ---- */

typedef struct shardopt_model_averager_s* shardopt_model_averager_t;

/* Collective over `world`. `opt`'s communicator must be one of the equal-sized groups that split
 * `world` (each rank in one), with the same params registered in each. Bad values (a period
 * <= 0, a group size that does not divide the world, ...) give SHARDOPT_ERR_INVALID_ARGUMENT
 * with torch's wording, replicas that differ SHARDOPT_ERR_MISMATCH, on every rank together.
 * CPU parameters only. */
SHARDOPT_C_API shardopt_status shardopt_model_averager_create(shardopt_comm_t world, shardopt_optimizer_t opt,
                                                              const shardopt_averager_config* config,
                                                              shardopt_model_averager_t* out);
/* NULL is a no-op. */
SHARDOPT_C_API shardopt_status shardopt_model_averager_destroy(shardopt_model_averager_t averager);
/* Collective over the world, after shardopt_optimizer_step: averages if this step is one to
 * average at (torch's average_parameters), then advances the step count. */
SHARDOPT_C_API shardopt_status shardopt_model_averager_average_parameters(shardopt_model_averager_t averager);
/* torch's averager.step: average_parameters() calls so far (or as set). */
SHARDOPT_C_API shardopt_status shardopt_model_averager_step(shardopt_model_averager_t averager, int64_t* out);
SHARDOPT_C_API shardopt_status shardopt_model_averager_set_step(shardopt_model_averager_t averager, int64_t step);
/* The group size (world ranks) the next average_parameters() averages over; 0 if it averages none. */
SHARDOPT_C_API shardopt_status shardopt_model_averager_next_group_size(shardopt_model_averager_t averager,
                                                                       int32_t* out);
/* Ranks per replica (L), and replicas in the world (world size / L). */
SHARDOPT_C_API shardopt_status shardopt_model_averager_replicas(shardopt_model_averager_t averager,
                                                                int32_t* replica_size, int32_t* num_replicas);
/* `out->struct_size` must be set by the caller (shardopt_communication_counts_init). */
SHARDOPT_C_API shardopt_status shardopt_model_averager_communication(shardopt_model_averager_t averager,
                                                                     shardopt_communication_counts* out);

/* ---- post-local SGD: torch's PostLocalSGDOptimizer over a shardopt optimizer ---- */

typedef struct shardopt_post_local_sgd_s* shardopt_post_local_sgd_t;

/* Collective over `world`, with the checks of shardopt_model_averager_create. Use it in place of
 * the optimizer's own reduce_gradients / reduce_gradient / step (the optimizer's other functions,
 * views, zero_grad, hyperparameters, stay as they are). */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_create(shardopt_comm_t world, shardopt_optimizer_t opt,
                                                              const shardopt_averager_config* config,
                                                              shardopt_post_local_sgd_t* out);
/* NULL is a no-op. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_destroy(shardopt_post_local_sgd_t plsgd);
/* Collective: averages gradients over the world during warmup, over the replica after it
 * (torch's post_localSGD_hook), as shardopt_optimizer_reduce_gradients does otherwise. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_reduce_gradients(shardopt_post_local_sgd_t plsgd);
/* Stage 2, bucket view: as shardopt_optimizer_reduce_gradient, with the averaging group above. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_reduce_gradient(shardopt_post_local_sgd_t plsgd, int32_t id,
                                                                       const shardopt_tensor* grad);
/* As shardopt_optimizer_reduce_gradient_dlpack: consumed on SHARDOPT_OK, the caller's otherwise. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_reduce_gradient_dlpack(shardopt_post_local_sgd_t plsgd,
                                                                              int32_t id,
                                                                              DLManagedTensorVersioned* grad);
/* Collective over the world: the optimizer's step, then the averager's average_parameters(). */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_step(shardopt_post_local_sgd_t plsgd);
/* Collective over the world: one checkpoint per replica plus the averager's state (its step and
 * the outer optimizer's), committed together by a record written last; a failed save leaves the
 * previous one loadable. load needs the same number of replicas (and, with an outer optimizer,
 * the same replica size). */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_save(shardopt_post_local_sgd_t plsgd, const char* dir);
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_load(shardopt_post_local_sgd_t plsgd, const char* dir);
/* The averager's step (torch's postlocal_sgd.averager.step) and setting it, e.g. when resuming
 * without a checkpoint. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_averager_step(shardopt_post_local_sgd_t plsgd, int64_t* out);
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_set_averager_step(shardopt_post_local_sgd_t plsgd,
                                                                         int64_t step);
/* As shardopt_model_averager_next_group_size, for the next step. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_next_group_size(shardopt_post_local_sgd_t plsgd, int32_t* out);
/* Gradient and averaging traffic. `out->struct_size` must be set by the caller. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_communication(shardopt_post_local_sgd_t plsgd,
                                                                     shardopt_communication_counts* out);
/* Collective within each replica: the optimizer's consolidate_state_dict(to), `to` a rank of the
 * replica. As with the optimizer, the consolidated dict itself is reachable from C++ and Python,
 * not from C: only its averager part is, below. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_consolidate_state_dict(shardopt_post_local_sgd_t plsgd,
                                                                              int to);
/* The averager's part of the state dict (torch's state_dict()["step"]) on the rank that
 * consolidated it: *has_step 1 and *step the averager's step now. On a rank that holds no
 * consolidated dict, SHARDOPT_ERR_INVALID_ARGUMENT, as the C++ state_dict() raises there. */
SHARDOPT_C_API shardopt_status shardopt_post_local_sgd_state_dict_step(shardopt_post_local_sgd_t plsgd,
                                                                       int32_t* has_step, int64_t* step);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDOPT_SHARDOPT_AVERAGING_H_ */
