// src/capi/capi_remote.cpp — the remote optimizer's C ABI (shardopt_remote.h) over shardopt::RemoteOptimizer: checked handles, statuses, a failed argument read joining the construction's agreement.
#include "shardopt/shardopt_remote.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "capi/boundary.hpp"
#include "capi/capi_convert.hpp"
#include "shardopt/remote.hpp"

struct shardopt_remote_s {
  uint64_t magic = 0;
  std::shared_ptr<shardopt::Communicator> comm;
  std::unique_ptr<shardopt::RemoteOptimizer> remote;
};

struct shardopt_remote_step_s {
  uint64_t magic = 0;
  shardopt::RemoteStepHandle step;
};

namespace shardopt {
namespace capi {
namespace {

constexpr uint64_t kRemoteMagic = 0x73686172645f726full;      // "shard_ro"
constexpr uint64_t kRemoteStepMagic = 0x73686172645f7273ull;  // "shard_rs"

shardopt_remote_s& checked_remote(shardopt_remote_t remote, const char* name) {
  check_handle(remote, kRemoteMagic, name);
  if (remote->magic != kRemoteMagic) fail(SHARDOPT_ERR_BAD_HANDLE, "{} is corrupted (bad magic number)", name);
  return *remote;
}

RemoteParam param_from(const shardopt_remote_param* p) {
  check_not_null(p, "param");
  return RemoteParam{p->id, p->rows, p->row_size, p->check};
}

RemoteOptions options_from(const shardopt_remote_options* o) {
  check_struct(o, "options", "shardopt_remote_options");
  RemoteOptions options;
  options.trainer = o->trainer != 0;
  options.order = o->deterministic != 0 ? RemoteOrder::deterministic : RemoteOrder::arrival;
  options.timeout_seconds = o->timeout_seconds;
  options.context_expiry_seconds = o->context_expiry_seconds;
  options.max_open_contexts = o->max_open_contexts;
  options.cpu_threads = o->cpu_threads;
  // A negative cap is refused by the constructor's validation, on every rank.
  if (newer_than<v1::remote_options>(o)) options.push_log_bytes = o->push_log_bytes;
  return options;
}

std::vector<RemoteGroupSpec> groups_from(const shardopt_remote_group* groups, int32_t count) {
  if (count < 0) fail(SHARDOPT_ERR_INVALID_ARGUMENT, "num_groups is {}", count);
  if (count > 0) check_not_null(groups, "groups");
  std::vector<RemoteGroupSpec> out;
  for (int32_t g = 0; g < count; ++g) {
    const shardopt_remote_group& in = groups[g];
    RemoteGroupSpec spec;
    spec.algorithm = static_cast<Algorithm>(in.algorithm);
    if (in.hyper != nullptr) spec.hyper = hyper_from(*in.hyper);
    if (in.num_params < 0 || (in.num_params > 0 && in.params == nullptr)) {
      fail(SHARDOPT_ERR_NULL_POINTER, "groups[{}].params is NULL or num_params {} is negative", g, in.num_params);
    }
    for (int32_t i = 0; i < in.num_params; ++i) {
      const shardopt_remote_param_spec& p = in.params[i];
      if (p.name == nullptr) fail(SHARDOPT_ERR_NULL_POINTER, "groups[{}].params[{}].name is NULL", g, i);
      spec.params.push_back(RemoteParamSpec{p.name, p.rows, p.row_size, p.row_begin, p.row_end, p.initial});
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;

extern "C" {

shardopt_status shardopt_remote_mpi_world(const shardopt_comm_options* options, shardopt_comm_t* out) {
  return guard("shardopt_remote_mpi_world", [&] {
    check_not_null(out, "out");
    *out = nullptr;
    shardopt::CommOptions o;
    if (options != nullptr) {
      o.timeout_seconds = options->timeout_seconds;
      o.ranks_per_node = options->ranks_per_node;
    }
    auto handle = std::make_unique<shardopt_comm_s>();
    handle->magic = kCommMagic;
    handle->comm = shardopt::remote_mpi_world(o);
    register_handle(handle.get(), kCommMagic);
    *out = handle.release();
  });
}

shardopt_status shardopt_remote_create(shardopt_comm_t comm, const shardopt_remote_group* groups, int32_t num_groups,
                                      const shardopt_remote_options* options, shardopt_remote_t* out) {
  return guard("shardopt_remote_create", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    check_not_null(out, "out");
    *out = nullptr;
    std::vector<shardopt::RemoteGroupSpec> specs;
    shardopt::RemoteOptions o;
    try {
      specs = groups_from(groups, num_groups);
      o = options_from(options);
    } catch (...) {
      // The other ranks are in the constructor's agreement: fail it with them.
      fail_collectively(*c.comm, "RemoteOptimizer", std::current_exception());
    }
    auto handle = std::make_unique<shardopt_remote_s>();
    handle->comm = c.comm;
    handle->remote = std::make_unique<shardopt::RemoteOptimizer>(c.comm, std::move(specs), o);
    handle->magic = kRemoteMagic;
    register_handle(handle.get(), kRemoteMagic);
    *out = handle.release();
  });
}

shardopt_status shardopt_remote_destroy(shardopt_remote_t remote) {
  return guard("shardopt_remote_destroy", [&] {
    if (remote == nullptr) return;
    checked_remote(remote, "remote");
    unregister_handle(remote);
    remote->magic = 0;
    delete remote;
  });
}

shardopt_status shardopt_remote_lookup(shardopt_remote_t remote, const char* name, shardopt_remote_param* out) {
  return guard("shardopt_remote_lookup", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(name, "name");
    check_not_null(out, "out");
    const shardopt::RemoteParam p = r.remote->lookup(name);
    *out = shardopt_remote_param{p.id, p.rows, p.row_size, p.check};
  });
}

shardopt_status shardopt_remote_open_context(shardopt_remote_t remote, int64_t* out) {
  return guard("shardopt_remote_open_context", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(out, "out");
    *out = r.remote->open_context();
  });
}

shardopt_status shardopt_remote_push(shardopt_remote_t remote, int64_t context, const shardopt_remote_param* param,
                                    const float* grad, int64_t numel) {
  return guard("shardopt_remote_push", [&] {
    checked_remote(remote, "remote").remote->push(context, param_from(param), grad, numel);
  });
}

shardopt_status shardopt_remote_push_rows(shardopt_remote_t remote, int64_t context, const shardopt_remote_param* param,
                                         const int64_t* rows, int64_t count, const float* values) {
  return guard("shardopt_remote_push_rows", [&] {
    checked_remote(remote, "remote").remote->push_rows(context, param_from(param), rows, count, values);
  });
}

shardopt_status shardopt_remote_step(shardopt_remote_t remote, int64_t context) {
  return guard("shardopt_remote_step", [&] { checked_remote(remote, "remote").remote->step(context); });
}

shardopt_status shardopt_remote_step_async(shardopt_remote_t remote, int64_t context, shardopt_remote_step_t* out) {
  return guard("shardopt_remote_step_async", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(out, "out");
    *out = nullptr;
    auto handle = std::make_unique<shardopt_remote_step_s>();
    handle->step = r.remote->step_async(context);
    handle->magic = kRemoteStepMagic;
    register_handle(handle.get(), kRemoteStepMagic);
    *out = handle.release();
  });
}

shardopt_status shardopt_remote_step_wait(shardopt_remote_step_t step) {
  return guard("shardopt_remote_step_wait", [&] {
    check_handle(step, kRemoteStepMagic, "step");
    std::unique_ptr<shardopt_remote_step_s> owned(step);
    unregister_handle(step);
    owned->magic = 0;
    owned->step.wait();
  });
}

shardopt_status shardopt_remote_pull(shardopt_remote_t remote, const shardopt_remote_param* param, float* out,
                                    int64_t numel) {
  return guard("shardopt_remote_pull", [&] {
    checked_remote(remote, "remote").remote->pull(param_from(param), out, numel);
  });
}

shardopt_status shardopt_remote_pull_rows(shardopt_remote_t remote, const shardopt_remote_param* param,
                                         const int64_t* rows, int64_t count, float* out) {
  return guard("shardopt_remote_pull_rows", [&] {
    checked_remote(remote, "remote").remote->pull_rows(param_from(param), rows, count, out);
  });
}

shardopt_status shardopt_remote_close(shardopt_remote_t remote) {
  return guard("shardopt_remote_close", [&] { checked_remote(remote, "remote").remote->close(); });
}

shardopt_status shardopt_remote_save(shardopt_remote_t remote, const char* dir) {
  return guard("shardopt_remote_save", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(dir, "dir");
    r.remote->save(dir);
  });
}

shardopt_status shardopt_remote_load(shardopt_remote_t remote, const char* dir) {
  return guard("shardopt_remote_load", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(dir, "dir");
    r.remote->load(dir);
  });
}

shardopt_status shardopt_remote_get_stats(shardopt_remote_t remote, shardopt_remote_stats* out) {
  return guard("shardopt_remote_get_stats", [&] {
    shardopt_remote_s& r = checked_remote(remote, "remote");
    check_not_null(out, "out");
    check_struct(out, "out", "shardopt_remote_stats");  // earlier sizes get their prefix only
    const shardopt::RemoteStats s = r.remote->stats();
    out->pushes_received = s.pushes_received;
    out->bytes_received = s.bytes_received;
    out->contexts_applied = s.contexts_applied;
    out->contexts_failed = s.contexts_failed;
    out->contexts_expired = s.contexts_expired;
    out->trainers_gone = s.trainers_gone;
    out->open_contexts = s.open_contexts;
    out->accumulator_bytes = s.accumulator_bytes;
    if (newer_than<v1::remote_stats>(out)) out->pooled_bytes = s.pooled_bytes;
    if (newer_than<v2::remote_stats>(out)) out->logged_bytes = s.logged_bytes;
  });
}

}  // extern "C"
