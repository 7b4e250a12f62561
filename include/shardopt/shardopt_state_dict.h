/* shardopt/shardopt_state_dict.h — the C ABI of the consolidated state dict: a handle over torch's optimizer.state_dict() gathered on one rank, enumerated and copied out by the caller. Included by shardopt/shardopt.h; its conventions hold here. */
#ifndef SHARDOPT_SHARDOPT_STATE_DICT_H_
#define SHARDOPT_SHARDOPT_STATE_DICT_H_

#include "shardopt/shardopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the consolidated state dict ------------------------------------------------------------ */

/* A snapshot of ZeroOptimizer::state_dict() (shardopt/checkpoint.hpp): for each registered
 * parameter its name, numel and dtype, its step and its state tensors by kind ("exp_avg",
 * "exp_avg_sq", "max_exp_avg_sq" for Adam/AdamW, "momentum_buffer" for SGD; each numel fp32
 * values, fp32 whatever the parameter's dtype), and the param groups with their hyperparameters.
 * Parameters without state (frozen, or never stepped) have no state kinds. Shardopt's
 * parameters are flat: numel is the whole shape it knows. Independent of the optimizer once
 * made: it stays valid, unchanged, after further steps or after the optimizer is destroyed. */
typedef struct shardopt_state_dict_s* shardopt_state_dict_t;

/* Not collective: after shardopt_optimizer_consolidate_state_dict(opt, to) on every rank, rank
 * `to` takes the dict it holds (the last one consolidated there, with the current param groups).
 * On any other rank, or before any consolidation, SHARDOPT_ERR_INVALID_ARGUMENT saying that this
 * rank holds none, and *out = NULL. Destroy the handle with shardopt_state_dict_destroy. */
SHARDOPT_C_API shardopt_status shardopt_optimizer_state_dict(shardopt_optimizer_t opt, shardopt_state_dict_t* out);
/* NULL is a no-op. */
SHARDOPT_C_API shardopt_status shardopt_state_dict_destroy(shardopt_state_dict_t dict);

typedef struct shardopt_state_dict_info {
  size_t struct_size;
  shardopt_algorithm algorithm;
  int32_t num_params;  /* every registered parameter, ids 0 .. num_params - 1 */
  int32_t num_groups;
  int32_t num_stateful; /* parameters that have state */
} shardopt_state_dict_info;

static inline void shardopt_state_dict_info_init(shardopt_state_dict_info* info) {
  info->struct_size = sizeof(shardopt_state_dict_info);
  info->algorithm = SHARDOPT_ALGORITHM_ADAM;
  info->num_params = 0;
  info->num_groups = 0;
  info->num_stateful = 0;
}

/* `out->struct_size` must be set by the caller (shardopt_state_dict_info_init). */
SHARDOPT_C_API shardopt_status shardopt_state_dict_get_info(shardopt_state_dict_t dict,
                                                            shardopt_state_dict_info* out);

typedef struct shardopt_state_dict_param {
  size_t struct_size;
  const char* name;     /* owned by the dict: valid until it is destroyed */
  int64_t numel;
  shardopt_dtype dtype; /* the parameter's own dtype (its state is fp32) */
  int32_t group;
  int64_t step;         /* optimizer steps it has taken; 0 without state */
  int32_t num_states;   /* state kinds present: 0 without state */
} shardopt_state_dict_param;

static inline void shardopt_state_dict_param_init(shardopt_state_dict_param* param) {
  param->struct_size = sizeof(shardopt_state_dict_param);
  param->name = NULL;
  param->numel = 0;
  param->dtype = SHARDOPT_DTYPE_F32;
  param->group = 0;
  param->step = 0;
  param->num_states = 0;
}

/* Parameter `id` (registration order). SHARDOPT_ERR_INVALID_ARGUMENT outside [0, num_params).
 * `out->struct_size` must be set by the caller (shardopt_state_dict_param_init). */
SHARDOPT_C_API shardopt_status shardopt_state_dict_get_param(shardopt_state_dict_t dict, int32_t id,
                                                             shardopt_state_dict_param* out);
/* The name of parameter `id`'s state kind `index` (0 .. num_states - 1, in the order of their
 * names: "exp_avg", "exp_avg_sq", ...), owned by the dict; its tensor has the parameter's numel
 * fp32 values. SHARDOPT_ERR_INVALID_ARGUMENT for an id or index out of range. */
SHARDOPT_C_API shardopt_status shardopt_state_dict_state_kind(shardopt_state_dict_t dict, int32_t id,
                                                              int32_t index, const char** out_kind);
/* Copies parameter `id`'s state tensor `kind` into `dst`, which must be exactly numel * 4 bytes
 * (`dst_bytes`): another size is refused with SHARDOPT_ERR_INVALID_ARGUMENT naming both sizes,
 * and nothing is written. SHARDOPT_ERR_INVALID_ARGUMENT as well for a kind the parameter lacks
 * (the message lists those it has). */
SHARDOPT_C_API shardopt_status shardopt_state_dict_copy_state(shardopt_state_dict_t dict, int32_t id,
                                                              const char* kind, float* dst, size_t dst_bytes);

/* Group `group`'s hyperparameters (`out->struct_size` set by the caller) and how many
 * parameters it has. Either output may be NULL. */
SHARDOPT_C_API shardopt_status shardopt_state_dict_get_group(shardopt_state_dict_t dict, int32_t group,
                                                             shardopt_hyperparams* out_hyper,
                                                             int32_t* out_num_params);
/* Group `group`'s parameter ids, in order, into `ids`, which must hold exactly the group's
 * number of parameters (`capacity`); another capacity is refused as copy_state refuses a size. */
SHARDOPT_C_API shardopt_status shardopt_state_dict_group_params(shardopt_state_dict_t dict, int32_t group,
                                                                int32_t* ids, size_t capacity);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDOPT_SHARDOPT_STATE_DICT_H_ */
