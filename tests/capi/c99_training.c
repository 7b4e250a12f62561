/* tests/capi/c99_training.c — a C99 user of the newer calls: bf16 parameters with clip_grad_norm and last_step, ZeRO-2 with reduce_gradient, the loss-scale getter and setter; each result checked against a value worked out by hand. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shardopt/shardopt.h"

#define W_NUMEL 19
#define B_NUMEL 4
#define P_NUMEL (W_NUMEL + B_NUMEL)

static int rank = -1;

#define CHECK_OK(call)                                                                          \
  do {                                                                                          \
    shardopt_status status_ = (call);                                                           \
    if (status_ != SHARDOPT_OK) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, shardopt_status_name(status_), \
              shardopt_last_error());                                                           \
      goto cleanup;                                                                             \
    }                                                                                           \
  } while (0)

#define EXPECT(condition, ...)                                  \
  do {                                                          \
    if (!(condition)) {                                         \
      fprintf(stderr, "rank %d: expected %s: ", rank, #condition); \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
      goto cleanup;                                             \
    }                                                           \
  } while (0)

static uint16_t bf16_of(float f) { /* exact values only: truncation */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

static float float_of_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static shardopt_tensor cpu_tensor(void* data, int64_t numel, shardopt_dtype dtype) {
  shardopt_tensor t;
  t.data = data;
  t.numel = numel;
  t.dtype = dtype;
  t.device_kind = SHARDOPT_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

int main(void) {
  int world = 0, failed = 1, i;
  uint16_t w[W_NUMEL], w_grad[W_NUMEL], b[B_NUMEL], b_grad[B_NUMEL];
  float x[W_NUMEL], y[B_NUMEL], x_grad[W_NUMEL], y_grad[B_NUMEL];
  shardopt_comm_t comm = NULL;
  shardopt_optimizer_t opt = NULL;
  shardopt_optimizer_config config;
  shardopt_hyperparams hyper;
  shardopt_param_desc params[2];
  shardopt_param_group_desc group;
  shardopt_memory_report report;
  shardopt_step_report last;
  shardopt_tensor grad;
  double norm = 0.0, expected_norm, scale = 0.0;
  float average;

  CHECK_OK(shardopt_comm_world(NULL, &comm));
  CHECK_OK(shardopt_comm_rank(comm, &rank));
  CHECK_OK(shardopt_comm_size(comm, &world));

  /* ---- bf16, external storage: rank r's gradient 0.25 (r + 1), averaged to 0.125 (world + 1)
   * (exact in bf16 for 1..3 ranks); the 2-norm of P_NUMEL equal values is average * sqrt(P). */
  for (i = 0; i < W_NUMEL; ++i) w[i] = bf16_of(1.0f);
  for (i = 0; i < B_NUMEL; ++i) b[i] = bf16_of(1.0f);
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.storage = SHARDOPT_STORAGE_EXTERNAL;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.5;
  shardopt_param_desc_init(&params[0]);
  params[0].name = "w";
  params[0].param = cpu_tensor(w, W_NUMEL, SHARDOPT_DTYPE_BF16);
  params[0].grad = cpu_tensor(w_grad, W_NUMEL, SHARDOPT_DTYPE_BF16);
  shardopt_param_desc_init(&params[1]);
  params[1].name = "b";
  params[1].param = cpu_tensor(b, B_NUMEL, SHARDOPT_DTYPE_BF16);
  params[1].grad = cpu_tensor(b_grad, B_NUMEL, SHARDOPT_DTYPE_BF16);
  shardopt_param_group_desc_init(&group);
  group.params = params;
  group.num_params = 2;
  group.hyperparams = &hyper;
  CHECK_OK(shardopt_optimizer_create(comm, &config, &group, 1, &opt));

  for (i = 0; i < W_NUMEL; ++i) w_grad[i] = bf16_of(0.25f * (float)(rank + 1));
  for (i = 0; i < B_NUMEL; ++i) b_grad[i] = bf16_of(0.25f * (float)(rank + 1));
  CHECK_OK(shardopt_optimizer_reduce_gradients(opt));
  average = 0.125f * (float)(world + 1);
  EXPECT(float_of_bf16(w_grad[0]) == average, "averaged gradient %g, not %g", float_of_bf16(w_grad[0]), average);
  CHECK_OK(shardopt_optimizer_clip_grad_norm(opt, 1e6, 2.0, &norm));
  expected_norm = average * sqrt((double)P_NUMEL);
  EXPECT(fabs(norm - expected_norm) <= 1e-6 * expected_norm, "norm %.9g, not %.9g", norm, expected_norm);
  CHECK_OK(shardopt_optimizer_step(opt));
  for (i = 0; i < W_NUMEL; ++i) {
    EXPECT(float_of_bf16(w[i]) == 1.0f - 0.5f * average, "w[%d] = %g", i, float_of_bf16(w[i]));
  }
  EXPECT(float_of_bf16(b[B_NUMEL - 1]) == 1.0f - 0.5f * average, "b[3] = %g", float_of_bf16(b[B_NUMEL - 1]));
  shardopt_step_report_init(&last);
  CHECK_OK(shardopt_optimizer_last_step(opt, &last));
  EXPECT(last.skipped == 0 && last.grad_norm == norm && last.clip_coef == 1.0 && last.loss_scale == 1.0,
         "last step: skipped %d, norm %g, coef %g, scale %g", (int)last.skipped, last.grad_norm, last.clip_coef,
         last.loss_scale);
  shardopt_memory_report_init(&report);
  CHECK_OK(shardopt_optimizer_memory_report(opt, &report));
  EXPECT(report.trainable_numel == P_NUMEL && report.master_bytes == 4 * report.shard_numel &&
             report.param_bytes == 0 && report.state_bytes == 0,
         "memory report: master %lld, params %lld, state %lld for a shard of %lld", (long long)report.master_bytes,
         (long long)report.param_bytes, (long long)report.state_bytes, (long long)report.shard_numel);
  /* Errors are statuses with messages. */
  EXPECT(shardopt_optimizer_clip_grad_norm(opt, 1.0, 1.0, NULL) == SHARDOPT_ERR_INVALID_ARGUMENT &&
             strstr(shardopt_last_error(), "norm_type 1 is not supported") != NULL,
         "clip_grad_norm(norm_type 1): %s", shardopt_last_error());
  last.struct_size = 0;
  EXPECT(shardopt_optimizer_last_step(opt, &last) == SHARDOPT_ERR_STRUCT_SIZE, "last_step(struct_size 0): %s",
         shardopt_last_error());
  CHECK_OK(shardopt_optimizer_destroy(opt));
  opt = NULL;

  /* ---- ZeRO-2, bucket view, loss scaling: gradients 8 * (rank + 1) at scale 8 unscale to an
   * average of (world + 1) / 2; SGD lr 0.5 moves each weight by (world + 1) / 4. */
  for (i = 0; i < W_NUMEL; ++i) x[i] = 2.0f;
  for (i = 0; i < B_NUMEL; ++i) y[i] = -1.0f;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.stage = 2;
  config.bucket_bytes = 32;
  config.loss_scaling.enabled = 1;
  config.loss_scaling.init_scale = 8.0;
  shardopt_param_desc_init(&params[0]);
  params[0].name = "x";
  params[0].param = cpu_tensor(x, W_NUMEL, SHARDOPT_DTYPE_F32);
  shardopt_param_desc_init(&params[1]);
  params[1].name = "y";
  params[1].param = cpu_tensor(y, B_NUMEL, SHARDOPT_DTYPE_F32);
  CHECK_OK(shardopt_optimizer_create(comm, &config, &group, 1, &opt));
  CHECK_OK(shardopt_optimizer_loss_scale(opt, &scale));
  EXPECT(scale == 8.0, "loss scale %g", scale);
  for (i = 0; i < W_NUMEL; ++i) x_grad[i] = 8.0f * (float)(rank + 1);
  for (i = 0; i < B_NUMEL; ++i) y_grad[i] = 8.0f * (float)(rank + 1);
  grad = cpu_tensor(x_grad, W_NUMEL, SHARDOPT_DTYPE_F32);
  CHECK_OK(shardopt_optimizer_reduce_gradient(opt, 0, &grad));
  grad = cpu_tensor(y_grad, B_NUMEL, SHARDOPT_DTYPE_F32);
  CHECK_OK(shardopt_optimizer_reduce_gradient(opt, 1, &grad));
  CHECK_OK(shardopt_optimizer_reduce_gradients(opt));
  CHECK_OK(shardopt_optimizer_step(opt));
  {
    shardopt_tensor view;
    const float* values;
    const float moved = 0.25f * (float)(world + 1);
    CHECK_OK(shardopt_optimizer_param_view(opt, 0, &view));
    values = (const float*)view.data;
    for (i = 0; i < W_NUMEL; ++i) EXPECT(values[i] == 2.0f - moved, "x[%d] = %g", i, values[i]);
    CHECK_OK(shardopt_optimizer_param_view(opt, 1, &view));
    values = (const float*)view.data;
    for (i = 0; i < B_NUMEL; ++i) EXPECT(values[i] == -1.0f - moved, "y[%d] = %g", i, values[i]);
  }
  shardopt_step_report_init(&last);
  CHECK_OK(shardopt_optimizer_last_step(opt, &last));
  EXPECT(last.skipped == 0 && last.loss_scale == 8.0 && last.skipped_steps == 0, "last step: skipped %d, scale %g",
         (int)last.skipped, last.loss_scale);
  shardopt_memory_report_init(&report);
  CHECK_OK(shardopt_optimizer_memory_report(opt, &report));
  /* One rank: the shard's gradients alone. Several ranks of one node: the rank's node-shared
     slot alone, the whole (padded) flat gradient buffer that grad views write into; the shard's
     average is summed into the slot's own positions. */
  EXPECT(world == 1 ? report.grad_bytes == 4 * report.shard_numel
                   : report.grad_bytes >= 4 * P_NUMEL && report.grad_bytes <= 4 * (P_NUMEL + 64 * world),
         "stage-2 gradient bytes %lld for a shard of %lld at %d ranks", (long long)report.grad_bytes,
         (long long)report.shard_numel, world);
  CHECK_OK(shardopt_optimizer_set_loss_scale(opt, 4.0));
  CHECK_OK(shardopt_optimizer_loss_scale(opt, &scale));
  EXPECT(scale == 4.0, "loss scale %g after setting 4", scale);
  EXPECT(shardopt_optimizer_set_loss_scale(opt, -1.0) == SHARDOPT_ERR_INVALID_ARGUMENT &&
             strstr(shardopt_last_error(), "shardopt_optimizer_set_loss_scale: ") != NULL,
         "set_loss_scale(-1): %s", shardopt_last_error());
  EXPECT(shardopt_optimizer_reduce_gradient(opt, 0, NULL) == SHARDOPT_ERR_NULL_POINTER &&
             strcmp(shardopt_last_error(), "shardopt_optimizer_reduce_gradient: grad is NULL") == 0,
         "reduce_gradient(NULL): %s", shardopt_last_error());
  CHECK_OK(shardopt_optimizer_destroy(opt));
  opt = NULL;

  /* stage 3 does not exist. */
  shardopt_optimizer_config_init(&config);
  config.stage = 3;
  EXPECT(shardopt_optimizer_create(comm, &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT &&
             strstr(shardopt_last_error(), "config->stage is 3") != NULL && opt == NULL,
         "stage 3: %s", shardopt_last_error());

  failed = 0;
  if (rank == 0) printf("c99 training: bf16 clip, ZeRO-2 reduce_gradient and loss scale checks passed\n");
cleanup:
  shardopt_optimizer_destroy(opt);
  shardopt_comm_destroy(comm);
  return failed;
}
