// src/capi/capi_step.cpp — the C functions of a training step over a ZeroOptimizer: views and layout, zero_grad, gradient reduction, clipping, loss scaling, step (params may sit it out) and its report, Join, memory report, checkpoints.
#include "capi/capi_convert.hpp"

using namespace shardopt::capi;

extern "C" {

shardopt_status shardopt_optimizer_param_step(shardopt_optimizer_t opt, int32_t id, int64_t* out) {
  return guard("shardopt_optimizer_param_step", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->param_step(id);
  });
}

shardopt_status shardopt_optimizer_param_view(shardopt_optimizer_t opt, int32_t id, shardopt_tensor* out) {
  return guard("shardopt_optimizer_param_view", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    tensor_to(o.opt->param_view(id), *out);
  });
}

shardopt_status shardopt_optimizer_grad_view(shardopt_optimizer_t opt, int32_t id, shardopt_tensor* out) {
  return guard("shardopt_optimizer_grad_view", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    tensor_to(o.opt->grad_view(id), *out);
  });
}

shardopt_status shardopt_optimizer_param_owner(shardopt_optimizer_t opt, int32_t id, int32_t* out) {
  return guard("shardopt_optimizer_param_owner", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->param_owner(id);
  });
}

shardopt_status shardopt_optimizer_layout_version(shardopt_optimizer_t opt, uint64_t* out) {
  return guard("shardopt_optimizer_layout_version", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->layout_version();
  });
}

shardopt_status shardopt_optimizer_zero_grad(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_zero_grad", [&] { checked_optimizer(opt, "opt").opt->zero_grad(); });
}

shardopt_status shardopt_optimizer_reduce_gradients(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_reduce_gradients", [&] { checked_optimizer(opt, "opt").opt->reduce_gradients(); });
}

shardopt_status shardopt_optimizer_reduce_gradient(shardopt_optimizer_t opt, int32_t id, const shardopt_tensor* grad) {
  return guard("shardopt_optimizer_reduce_gradient", [&] {
    hand_gradient(*checked_optimizer(opt, "opt").opt, id, grad);
  });
}

shardopt_status shardopt_optimizer_reduce_gradient_dlpack(shardopt_optimizer_t opt, int32_t id,
                                                          DLManagedTensorVersioned* grad) {
  return guard("shardopt_optimizer_reduce_gradient_dlpack", [&] {
    hand_gradient(*checked_optimizer(opt, "opt").opt, id, grad);
  });
}

shardopt_status shardopt_optimizer_clip_grad_norm(shardopt_optimizer_t opt, double max_norm, double norm_type,
                                                  double* out_norm) {
  return guard("shardopt_optimizer_clip_grad_norm", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    // out_norm is optional: refusing a NULL on one rank alone would leave the others in the
    // collective.
    const double norm = o.opt->clip_grad_norm(max_norm, norm_type);
    if (out_norm != nullptr) *out_norm = norm;
  });
}

shardopt_status shardopt_optimizer_loss_scale(shardopt_optimizer_t opt, double* out) {
  return guard("shardopt_optimizer_loss_scale", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->loss_scale();
  });
}

shardopt_status shardopt_optimizer_set_loss_scale(shardopt_optimizer_t opt, double scale) {
  return guard("shardopt_optimizer_set_loss_scale",
               [&] { checked_optimizer(opt, "opt").opt->set_loss_scale(scale); });
}

shardopt_status shardopt_optimizer_step(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_step", [&] { checked_optimizer(opt, "opt").opt->step(); });
}

shardopt_status shardopt_optimizer_step_without(shardopt_optimizer_t opt, const int32_t* ids, int64_t count) {
  return guard("shardopt_optimizer_step_without", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    std::vector<shardopt::ParamId> without_grad;
    try {
      if (count < 0) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "count is {}; it must be 0 or more", count);
      if (count > 0) check_not_null(ids, "ids");
      if (count > 0) without_grad.assign(ids, ids + count);
    } catch (...) {
      // The other ranks are entering step()'s agreement: take part in it with this failure so
      // that they fail too, naming this rank. Overlapped gathers still queued on the
      // communicator land first, as step() itself would let them.
      o.opt->wait_all();
      fail_collectively(*o.comm, "step", std::current_exception());
    }
    // Ids out of range fail inside step()'s agreement, on every rank.
    o.opt->step(without_grad);
  });
}

shardopt_status shardopt_optimizer_grad_ready(shardopt_optimizer_t opt, int32_t id) {
  return guard("shardopt_optimizer_grad_ready", [&] { checked_optimizer(opt, "opt").opt->grad_ready(id); });
}

shardopt_status shardopt_optimizer_wait_param(shardopt_optimizer_t opt, int32_t id) {
  return guard("shardopt_optimizer_wait_param", [&] { checked_optimizer(opt, "opt").opt->wait_param(id); });
}

shardopt_status shardopt_optimizer_wait_bucket(shardopt_optimizer_t opt, int32_t bucket) {
  return guard("shardopt_optimizer_wait_bucket", [&] { checked_optimizer(opt, "opt").opt->wait_bucket(bucket); });
}

shardopt_status shardopt_optimizer_wait_all(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_wait_all", [&] { checked_optimizer(opt, "opt").opt->wait_all(); });
}

shardopt_status shardopt_optimizer_num_buckets(shardopt_optimizer_t opt, int32_t* out) {
  return guard("shardopt_optimizer_num_buckets", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    if (out == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "out is NULL");
    *out = o.opt->num_buckets();
  });
}

shardopt_status shardopt_optimizer_join(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_join", [&] { checked_optimizer(opt, "opt").opt->join(); });
}

shardopt_status shardopt_optimizer_join_step(shardopt_optimizer_t opt, int* shadowed_a_step) {
  return guard("shardopt_optimizer_join_step", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    // Optional, as clip_grad_norm's out_norm: a NULL refused on one rank alone would leave the
    // others in the collective. A failed call leaves 0, which ends a caller's join loop.
    if (shadowed_a_step != nullptr) *shadowed_a_step = 0;
    const bool shadowed = o.opt->join_step();
    if (shadowed_a_step != nullptr) *shadowed_a_step = shadowed ? 1 : 0;
  });
}

shardopt_status shardopt_optimizer_last_step(shardopt_optimizer_t opt, shardopt_step_report* out) {
  return guard("shardopt_optimizer_last_step", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_step_report");
    const shardopt::StepReport& report = o.opt->last_step();
    out->skipped = report.skipped ? 1 : 0;
    out->loss_scale = report.loss_scale;
    out->grad_norm = report.grad_norm;
    out->clip_coef = report.clip_coef;
    out->skipped_steps = report.skipped_steps;
    if (!newer_than<v1::step_report>(out)) return;
    out->agree_seconds = report.agree_seconds;
    out->update_seconds = report.update_seconds;
    out->sync_seconds = report.sync_seconds;
    if (!newer_than<v2::step_report>(out)) return;
    out->newton_schulz_seconds = report.newton_schulz_seconds;
  });
}

shardopt_status shardopt_optimizer_cuda_stream(shardopt_optimizer_t opt, void** out) {
  return guard("shardopt_optimizer_cuda_stream", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(out, "out");
    *out = o.opt->cuda_stream();
  });
}

shardopt_status shardopt_optimizer_memory_report(shardopt_optimizer_t opt, shardopt_memory_report* out) {
  return guard("shardopt_optimizer_memory_report", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_struct(out, "out", "shardopt_memory_report");
    const shardopt::MemoryReport report = o.opt->memory_report();
    out->state_bytes = report.state_bytes;
    // The first header's two totals, kept in the struct for its callers: all staging is
    // counted with the gradients, so the two still add up to every byte held but state.
    out->param_buffer_bytes = report.param_bytes;
    out->grad_buffer_bytes = report.grad_bytes + report.buffer_bytes;
    out->shard_numel = report.shard_numel;
    out->trainable_numel = report.trainable_numel;
    // An earlier header's struct ends here: writing on would overrun the caller's memory.
    if (!newer_than<v1::memory_report>(out)) return;
    out->master_bytes = report.master_bytes;
    out->param_bytes = report.param_bytes;
    out->grad_bytes = report.grad_bytes;
    out->buffer_bytes = report.buffer_bytes;
    if (!newer_than<v2::memory_report>(out)) return;
    out->node_shared_param_bytes = report.node_shared_param_bytes;
    out->node_ranks = report.node_ranks;
  });
}

shardopt_status shardopt_optimizer_save(shardopt_optimizer_t opt, const char* dir) {
  return guard("shardopt_optimizer_save", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(dir, "dir");
    o.opt->save(dir);
  });
}

shardopt_status shardopt_optimizer_save_async(shardopt_optimizer_t opt, const char* dir) {
  return guard("shardopt_optimizer_save_async", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(dir, "dir");
    o.opt->save_async(dir);
  });
}

shardopt_status shardopt_optimizer_wait_save(shardopt_optimizer_t opt) {
  return guard("shardopt_optimizer_wait_save", [&] { checked_optimizer(opt, "opt").opt->wait_save(); });
}

shardopt_status shardopt_optimizer_load(shardopt_optimizer_t opt, const char* dir) {
  return guard("shardopt_optimizer_load", [&] {
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    check_not_null(dir, "dir");
    o.opt->load(dir);
  });
}

shardopt_status shardopt_optimizer_consolidate_state_dict(shardopt_optimizer_t opt, int to) {
  return guard("shardopt_optimizer_consolidate_state_dict", [&] {
    checked_optimizer(opt, "opt").opt->consolidate_state_dict(to);
  });
}

}  // extern "C"
