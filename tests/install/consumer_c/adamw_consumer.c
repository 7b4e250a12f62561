/* tests/install/consumer_c/adamw_consumer.c — a C99 user of the C ABI: ranks take three sharded AdamW steps and check them, the consolidated state dict and a few collectives against scalar references. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shardopt/shardopt.h"

#define W_NUMEL 37 /* odd: the flat partition pads it and a rank boundary falls inside it */
#define B_NUMEL 5
#define STEPS 3

/* Reports a failed call with its status and message; jumps to cleanup. */
#define CHECK_OK(call)                                                                          \
  do {                                                                                          \
    shardopt_status status_ = (call);                                                           \
    if (status_ != SHARDOPT_OK) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, shardopt_status_name(status_), \
              shardopt_last_error());                                                           \
      goto cleanup;                                                                             \
    }                                                                                           \
  } while (0)

static void count_delete(DLManagedTensorVersioned* self) { ++*(int*)self->manager_ctx; }

/* The gradient every rank writes before averaging: rank-dependent, so the average matters. */
static float local_grad(int i, int step, int rank) {
  return 0.01f * (float)(i % 7 - 3) * (float)(rank + 1) + 0.001f * (float)step;
}

/* torch.optim.AdamW on one element for STEPS steps, in double. */
static double reference_adamw(double p, int i, int world) {
  const double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  double m = 0.0, v = 0.0;
  int step;
  for (step = 0; step < STEPS; ++step) {
    double g = 0.0;
    int r;
    for (r = 0; r < world; ++r) g += local_grad(i, step, r);
    g /= world;
    p *= 1.0 - lr * weight_decay;
    m = beta1 * m + (1.0 - beta1) * g;
    v = beta2 * v + (1.0 - beta2) * g * g;
    {
      const double bias1 = 1.0 - pow(beta1, step + 1), bias2 = 1.0 - pow(beta2, step + 1);
      p -= lr / bias1 * m / (sqrt(v) / sqrt(bias2) + eps);
    }
  }
  return p;
}

/* AdamW's exp_avg of one element after STEPS steps, in double. */
static double reference_exp_avg(int i, int world) {
  double m = 0.0;
  int step, r;
  for (step = 0; step < STEPS; ++step) {
    double g = 0.0;
    for (r = 0; r < world; ++r) g += local_grad(i, step, r);
    m = 0.9 * m + 0.1 * (g / world);
  }
  return m;
}

/* Rank `to` reads the consolidated dict: names, steps, kinds, exp_avg against the reference, and
 * a wrong buffer size refused. Returns 0 when all is as expected. */
static int check_state_dict(shardopt_state_dict_t dict, int rank, int world) {
  shardopt_state_dict_info info;
  shardopt_state_dict_param p;
  const char* kind = NULL;
  float exp_avg[W_NUMEL];
  int i;
  shardopt_state_dict_info_init(&info);
  shardopt_state_dict_param_init(&p);
  if (shardopt_state_dict_get_info(dict, &info) != SHARDOPT_OK || info.num_params != 2 || info.num_groups != 1 ||
      info.num_stateful != 2 || info.algorithm != SHARDOPT_ALGORITHM_ADAMW) {
    fprintf(stderr, "rank %d: unexpected state dict info (%s)\n", rank, shardopt_last_error());
    return 1;
  }
  if (shardopt_state_dict_get_param(dict, 0, &p) != SHARDOPT_OK || strcmp(p.name, "w") != 0 ||
      p.numel != W_NUMEL || p.step != STEPS || p.num_states != 2 ||
      shardopt_state_dict_state_kind(dict, 0, 0, &kind) != SHARDOPT_OK || strcmp(kind, "exp_avg") != 0) {
    fprintf(stderr, "rank %d: unexpected state of 'w' (%s)\n", rank, shardopt_last_error());
    return 1;
  }
  if (shardopt_state_dict_copy_state(dict, 0, "exp_avg", exp_avg, sizeof exp_avg) != SHARDOPT_OK) {
    fprintf(stderr, "rank %d: copy_state: %s\n", rank, shardopt_last_error());
    return 1;
  }
  for (i = 0; i < W_NUMEL; ++i) {
    if (fabs(exp_avg[i] - reference_exp_avg(i, world)) > 1e-7) {
      fprintf(stderr, "rank %d: exp_avg[%d] is %g, expected %g\n", rank, i, exp_avg[i], reference_exp_avg(i, world));
      return 1;
    }
  }
  if (shardopt_state_dict_copy_state(dict, 0, "exp_avg", exp_avg, sizeof exp_avg - 4) !=
          SHARDOPT_ERR_INVALID_ARGUMENT ||
      strstr(shardopt_last_error(), "dst_bytes is 144, but state 'exp_avg' of parameter 'w' is 37 fp32 values") ==
          NULL) {
    fprintf(stderr, "rank %d: a short buffer was not refused as expected: %s\n", rank, shardopt_last_error());
    return 1;
  }
  return 0;
}

int main(void) {
  int rank = -1, world = 0, failed = 1, deletes = 0, i, step;
  float w[W_NUMEL], w_grad[W_NUMEL], b[B_NUMEL], b_grad[B_NUMEL];
  int64_t b_shape[1] = {B_NUMEL};
  DLManagedTensorVersioned b_tensor, b_grad_tensor;
  shardopt_comm_t comm = NULL;
  shardopt_optimizer_t opt = NULL;
  shardopt_optimizer_config config;
  shardopt_hyperparams hyper;
  shardopt_param_desc params[2];
  shardopt_param_group_desc group;
  shardopt_memory_report report;
  double worst = 0.0;
  int32_t id = -1;

  for (i = 0; i < W_NUMEL; ++i) w[i] = 0.5f + 0.01f * (float)i;
  for (i = 0; i < B_NUMEL; ++i) b[i] = -0.25f * (float)i;

  CHECK_OK(shardopt_comm_world(NULL, &comm));
  CHECK_OK(shardopt_comm_rank(comm, &rank));
  CHECK_OK(shardopt_comm_size(comm, &world));

  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.storage = SHARDOPT_STORAGE_EXTERNAL; /* updates land in w[] and b[] */
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;

  /* "w" as a raw pointer + numel (dtype f32 and CPU are the defaults)... */
  shardopt_param_desc_init(&params[0]);
  params[0].name = "w";
  params[0].param.data = w;
  params[0].param.numel = W_NUMEL;
  params[0].grad.data = w_grad;
  params[0].grad.numel = W_NUMEL;
  /* ...and "b" as DLPack tensors, which the optimizer releases when it is destroyed. */
  memset(&b_tensor, 0, sizeof b_tensor);
  b_tensor.version.major = DLPACK_MAJOR_VERSION;
  b_tensor.version.minor = DLPACK_MINOR_VERSION;
  b_tensor.manager_ctx = &deletes;
  b_tensor.deleter = count_delete;
  b_tensor.dl_tensor.data = b;
  b_tensor.dl_tensor.device.device_type = kDLCPU;
  b_tensor.dl_tensor.ndim = 1;
  b_tensor.dl_tensor.dtype.code = kDLFloat;
  b_tensor.dl_tensor.dtype.bits = 32;
  b_tensor.dl_tensor.dtype.lanes = 1;
  b_tensor.dl_tensor.shape = b_shape;
  b_grad_tensor = b_tensor;
  b_grad_tensor.dl_tensor.data = b_grad;
  shardopt_param_desc_init(&params[1]);
  params[1].name = "b";
  params[1].param_dlpack = &b_tensor;
  params[1].grad_dlpack = &b_grad_tensor;

  shardopt_param_group_desc_init(&group);
  group.params = params;
  group.num_params = 2;
  group.hyperparams = &hyper;
  CHECK_OK(shardopt_optimizer_create(comm, &config, &group, 1, &opt));

  for (step = 0; step < STEPS; ++step) {
    for (i = 0; i < W_NUMEL; ++i) w_grad[i] = local_grad(i, step, rank);
    for (i = 0; i < B_NUMEL; ++i) b_grad[i] = local_grad(i, step, rank);
    CHECK_OK(shardopt_optimizer_reduce_gradients(opt));
    CHECK_OK(shardopt_optimizer_step(opt));
  }

  for (i = 0; i < W_NUMEL + B_NUMEL; ++i) {
    const int in_w = i < W_NUMEL, k = in_w ? i : i - W_NUMEL;
    const double start = in_w ? 0.5 + 0.01 * k : -0.25 * k;
    const double got = in_w ? w[k] : b[k];
    const double error = fabs(got - reference_adamw((double)(float)start, k, world));
    if (error > worst) worst = error;
  }
  if (worst > 1e-6) {
    fprintf(stderr, "rank %d: AdamW differs from the reference by %g\n", rank, worst);
    goto cleanup;
  }

  /* Sharded: this rank holds exp_avg and exp_avg_sq for its share only. */
  report.struct_size = sizeof report;
  CHECK_OK(shardopt_optimizer_memory_report(opt, &report));
  if (report.trainable_numel != W_NUMEL + B_NUMEL || report.state_bytes != 8 * report.shard_numel ||
      (world > 1 && report.shard_numel >= report.trainable_numel)) {
    fprintf(stderr, "rank %d: unexpected memory report (shard %lld of %lld, state %lld bytes)\n", rank,
            (long long)report.shard_numel, (long long)report.trainable_numel, (long long)report.state_bytes);
    goto cleanup;
  }

  /* The consolidated state on the last rank, read from C. */
  CHECK_OK(shardopt_optimizer_consolidate_state_dict(opt, world - 1));
  if (rank == world - 1) {
    shardopt_state_dict_t dict = NULL;
    CHECK_OK(shardopt_optimizer_state_dict(opt, &dict));
    failed = check_state_dict(dict, rank, world);
    shardopt_state_dict_destroy(dict);
    if (failed) goto cleanup;
    failed = 1;
  }

  /* Collectives on the communicator: a sum of small integers, a broadcast from the last rank. */
  {
    float value[2];
    value[0] = (float)(rank + 1);
    value[1] = (float)(10 * rank);
    CHECK_OK(shardopt_comm_all_reduce(comm, value, 2, SHARDOPT_DTYPE_F32, SHARDOPT_REDUCE_SUM));
    if (value[0] != (float)(world * (world + 1) / 2) || value[1] != (float)(5 * world * (world - 1))) {
      fprintf(stderr, "rank %d: all_reduce gave %g, %g\n", rank, value[0], value[1]);
      goto cleanup;
    }
    value[0] = (float)rank;
    CHECK_OK(shardopt_comm_broadcast(comm, value, 1, SHARDOPT_DTYPE_F32, world - 1));
    if (value[0] != (float)(world - 1)) {
      fprintf(stderr, "rank %d: broadcast gave %g\n", rank, value[0]);
      goto cleanup;
    }
  }

  /* Errors come back as a status and a message, never as a crash. */
  if (shardopt_optimizer_find_param(opt, "missing", &id) != SHARDOPT_ERR_INVALID_ARGUMENT ||
      strstr(shardopt_last_error(), "missing") == NULL) {
    fprintf(stderr, "rank %d: find_param(\"missing\") did not fail as expected\n", rank);
    goto cleanup;
  }

  CHECK_OK(shardopt_optimizer_destroy(opt));
  opt = NULL;
  if (deletes != 2) {
    fprintf(stderr, "rank %d: %d DLPack deleter calls, expected 2\n", rank, deletes);
    goto cleanup;
  }
  failed = 0;
  printf("rank %d: %d sharded AdamW steps over %d ranks match the reference (max error %.3g), and so do the state "
         "dict and collectives; shard %lld of %lld\n",
         rank, STEPS, world, worst, (long long)report.shard_numel, (long long)report.trainable_numel);

cleanup:
  shardopt_optimizer_destroy(opt);
  shardopt_comm_destroy(comm);
  return failed;
}
