// src/capi/capi_averaging.cpp — the C functions over model averaging: ModelAverager and PostLocalSGDOptimizer handles built over a world communicator and an optimizer handle, their config and communication counts.
#include "capi/capi_convert.hpp"

// Each keeps the optimizer handle it was built over alive (retained), since the C++ objects hold
// a reference to its ZeroOptimizer.
struct shardopt_model_averager_s {
  uint64_t magic = 0;
  shardopt_optimizer_s* optimizer = nullptr;
  std::unique_ptr<shardopt::ModelAverager> averager;
};

struct shardopt_post_local_sgd_s {
  uint64_t magic = 0;
  shardopt_optimizer_s* optimizer = nullptr;
  std::unique_ptr<shardopt::PostLocalSGDOptimizer> plsgd;
};

namespace shardopt {
namespace capi {
namespace {

// Only the shape of the struct is checked here; the values (periods, group sizes, warmup,
// bucket size) are checked by the C++ constructor inside its agreement, on every rank together.
AveragerConfig averager_config_from(const shardopt_averager_config* config) {
  check_struct(config, "config", "shardopt_averager_config");
  if (config->num_levels > 0 && config->levels == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER, "config->levels is NULL but config->num_levels is {}", config->num_levels);
  }
  AveragerConfig result;
  for (std::size_t i = 0; i < config->num_levels; ++i) {
    AveragingLevel level;
    level.period = config->levels[i].period;
    level.group_size = config->levels[i].group_size;
    result.levels.push_back(level);
  }
  result.warmup_steps = config->warmup_steps;
  result.hierarchical = config->hierarchical != 0;
  result.bucket_bytes = config->bucket_bytes;
  const shardopt_outer_optimizer& outer = config->outer;
  result.outer.enabled = outer.enabled != 0;
  result.outer.lr = outer.lr;
  result.outer.momentum = outer.momentum;
  result.outer.nesterov = outer.nesterov != 0;
  return result;
}

// The arguments of a create, read on this rank. A failure joins the agreement over `world`
// that the other ranks' constructors start ("ModelAverager", also inside PostLocalSGDOptimizer),
// so that they fail too instead of waiting for this rank.
shardopt_optimizer_s& create_arguments(Communicator& world, shardopt_optimizer_t opt,
                                       const shardopt_averager_config* config, AveragerConfig& parsed, void* out) {
  try {
    check_not_null(out, "out");
    shardopt_optimizer_s& o = checked_optimizer(opt, "opt");
    parsed = averager_config_from(config);
    return o;
  } catch (...) {
    fail_collectively(world, "ModelAverager", std::current_exception());
  }
}

// Registers a handle that retains `optimizer`; on failure nothing stays retained or registered.
template <typename Handle, typename Object>
Handle* publish(uint64_t magic, shardopt_optimizer_s& optimizer, std::unique_ptr<Object> object,
                std::unique_ptr<Object> Handle::*member) {
  auto handle = std::make_unique<Handle>();
  handle->magic = magic;
  (*handle).*member = std::move(object);
  retain_optimizer(optimizer);
  handle->optimizer = &optimizer;
  try {
    register_handle(handle.get(), magic);
  } catch (...) {
    ((*handle).*member).reset();
    release_optimizer(&optimizer);
    throw;
  }
  return handle.release();
}

// A live handle of one kind (`creator` names the function that makes them, for messages).
template <typename Handle>
Handle& checked_handle(Handle* handle, uint64_t magic, const char* creator, const char* name) {
  if (handle == nullptr) {
    fail(SHARDOPT_ERR_NULL_POINTER, "{} is NULL; {} leaves its output NULL when it fails", name, creator);
  }
  check_handle(handle, magic, name);
  if (handle->magic != magic) fail(SHARDOPT_ERR_BAD_HANDLE, "{} is corrupted (bad magic number)", name);
  return *handle;
}

shardopt_model_averager_s& checked_averager(shardopt_model_averager_t averager, const char* name) {
  return checked_handle(averager, kModelAveragerMagic, "shardopt_model_averager_create", name);
}

shardopt_post_local_sgd_s& checked_plsgd(shardopt_post_local_sgd_t plsgd, const char* name) {
  return checked_handle(plsgd, kPostLocalSgdMagic, "shardopt_post_local_sgd_create", name);
}

// Both creates: the C++ object (ModelAverager or PostLocalSGDOptimizer) over `world` and the
// optimizer, published as a handle that retains the optimizer.
template <typename Handle, typename Object>
void create_handle(uint64_t magic, std::unique_ptr<Object> Handle::*member, shardopt_comm_t world,
                   shardopt_optimizer_t opt, const shardopt_averager_config* config, Handle** out) {
  // Without a usable world the other ranks cannot be told: fail here alone.
  shardopt_comm_s& w = checked_comm(world, "world");
  if (out != nullptr) *out = nullptr;
  AveragerConfig parsed;
  shardopt_optimizer_s& o = create_arguments(*w.comm, opt, config, parsed, out);
  *out = publish(magic, o, std::make_unique<Object>(w.comm, *o.opt, std::move(parsed)), member);
}

template <typename Handle, typename Object>
void destroy_handle(Handle* handle, uint64_t magic, const char* creator, std::unique_ptr<Object> Handle::*member,
                    const char* name) {
  if (handle == nullptr) return;
  checked_handle(handle, magic, creator, name);
  unregister_handle(handle);
  handle->magic = 0;
  (handle->*member).reset();  // before the optimizer it refers to may go
  release_optimizer(handle->optimizer);
  delete handle;
}

void counts_to(const CommunicationCounts& counts, shardopt_communication_counts* out) {
  check_struct(out, "out", "shardopt_communication_counts");
  out->gradient_bytes = counts.gradient_bytes;
  out->averaging_bytes = counts.averaging_bytes;
  out->averages = counts.averages;
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;

extern "C" {

// ---- ModelAverager ----------------------------------------------------------------------------

shardopt_status shardopt_model_averager_create(shardopt_comm_t world, shardopt_optimizer_t opt,
                                               const shardopt_averager_config* config, shardopt_model_averager_t* out) {
  return guard("shardopt_model_averager_create", [&] {
    create_handle(kModelAveragerMagic, &shardopt_model_averager_s::averager, world, opt, config, out);
  });
}

shardopt_status shardopt_model_averager_destroy(shardopt_model_averager_t averager) {
  return guard("shardopt_model_averager_destroy", [&] {
    destroy_handle(averager, kModelAveragerMagic, "shardopt_model_averager_create",
                   &shardopt_model_averager_s::averager, "averager");
  });
}

shardopt_status shardopt_model_averager_average_parameters(shardopt_model_averager_t averager) {
  return guard("shardopt_model_averager_average_parameters",
               [&] { checked_averager(averager, "averager").averager->average_parameters(); });
}

shardopt_status shardopt_model_averager_step(shardopt_model_averager_t averager, int64_t* out) {
  return guard("shardopt_model_averager_step", [&] {
    shardopt_model_averager_s& a = checked_averager(averager, "averager");
    check_not_null(out, "out");
    *out = a.averager->step();
  });
}

shardopt_status shardopt_model_averager_set_step(shardopt_model_averager_t averager, int64_t step) {
  return guard("shardopt_model_averager_set_step",
               [&] { checked_averager(averager, "averager").averager->set_step(step); });
}

shardopt_status shardopt_model_averager_next_group_size(shardopt_model_averager_t averager, int32_t* out) {
  return guard("shardopt_model_averager_next_group_size", [&] {
    shardopt_model_averager_s& a = checked_averager(averager, "averager");
    check_not_null(out, "out");
    *out = a.averager->next_group_size();
  });
}

shardopt_status shardopt_model_averager_replicas(shardopt_model_averager_t averager, int32_t* replica_size,
                                                 int32_t* num_replicas) {
  return guard("shardopt_model_averager_replicas", [&] {
    shardopt_model_averager_s& a = checked_averager(averager, "averager");
    check_not_null(replica_size, "replica_size");
    check_not_null(num_replicas, "num_replicas");
    *replica_size = a.averager->replica_size();
    *num_replicas = a.averager->num_replicas();
  });
}

shardopt_status shardopt_model_averager_communication(shardopt_model_averager_t averager,
                                                      shardopt_communication_counts* out) {
  return guard("shardopt_model_averager_communication",
               [&] { counts_to(checked_averager(averager, "averager").averager->communication(), out); });
}

// ---- PostLocalSGDOptimizer --------------------------------------------------------------------

shardopt_status shardopt_post_local_sgd_create(shardopt_comm_t world, shardopt_optimizer_t opt,
                                               const shardopt_averager_config* config, shardopt_post_local_sgd_t* out) {
  return guard("shardopt_post_local_sgd_create", [&] {
    create_handle(kPostLocalSgdMagic, &shardopt_post_local_sgd_s::plsgd, world, opt, config, out);
  });
}

shardopt_status shardopt_post_local_sgd_destroy(shardopt_post_local_sgd_t plsgd) {
  return guard("shardopt_post_local_sgd_destroy", [&] {
    destroy_handle(plsgd, kPostLocalSgdMagic, "shardopt_post_local_sgd_create", &shardopt_post_local_sgd_s::plsgd,
                   "plsgd");
  });
}

shardopt_status shardopt_post_local_sgd_reduce_gradients(shardopt_post_local_sgd_t plsgd) {
  return guard("shardopt_post_local_sgd_reduce_gradients",
               [&] { checked_plsgd(plsgd, "plsgd").plsgd->reduce_gradients(); });
}

shardopt_status shardopt_post_local_sgd_reduce_gradient(shardopt_post_local_sgd_t plsgd, int32_t id,
                                                        const shardopt_tensor* grad) {
  return guard("shardopt_post_local_sgd_reduce_gradient", [&] {
    hand_gradient(*checked_plsgd(plsgd, "plsgd").plsgd, id, grad);
  });
}

shardopt_status shardopt_post_local_sgd_reduce_gradient_dlpack(shardopt_post_local_sgd_t plsgd, int32_t id,
                                                               DLManagedTensorVersioned* grad) {
  return guard("shardopt_post_local_sgd_reduce_gradient_dlpack", [&] {
    hand_gradient(*checked_plsgd(plsgd, "plsgd").plsgd, id, grad);
  });
}

shardopt_status shardopt_post_local_sgd_step(shardopt_post_local_sgd_t plsgd) {
  return guard("shardopt_post_local_sgd_step", [&] { checked_plsgd(plsgd, "plsgd").plsgd->step(); });
}

shardopt_status shardopt_post_local_sgd_save(shardopt_post_local_sgd_t plsgd, const char* dir) {
  return guard("shardopt_post_local_sgd_save", [&] {
    shardopt_post_local_sgd_s& p = checked_plsgd(plsgd, "plsgd");
    check_not_null(dir, "dir");
    p.plsgd->save(dir);
  });
}

shardopt_status shardopt_post_local_sgd_load(shardopt_post_local_sgd_t plsgd, const char* dir) {
  return guard("shardopt_post_local_sgd_load", [&] {
    shardopt_post_local_sgd_s& p = checked_plsgd(plsgd, "plsgd");
    check_not_null(dir, "dir");
    p.plsgd->load(dir);
  });
}

shardopt_status shardopt_post_local_sgd_averager_step(shardopt_post_local_sgd_t plsgd, int64_t* out) {
  return guard("shardopt_post_local_sgd_averager_step", [&] {
    shardopt_post_local_sgd_s& p = checked_plsgd(plsgd, "plsgd");
    check_not_null(out, "out");
    *out = p.plsgd->averager().step();
  });
}

shardopt_status shardopt_post_local_sgd_set_averager_step(shardopt_post_local_sgd_t plsgd, int64_t step) {
  return guard("shardopt_post_local_sgd_set_averager_step",
               [&] { checked_plsgd(plsgd, "plsgd").plsgd->averager().set_step(step); });
}

shardopt_status shardopt_post_local_sgd_next_group_size(shardopt_post_local_sgd_t plsgd, int32_t* out) {
  return guard("shardopt_post_local_sgd_next_group_size", [&] {
    shardopt_post_local_sgd_s& p = checked_plsgd(plsgd, "plsgd");
    check_not_null(out, "out");
    *out = p.plsgd->averager().next_group_size();
  });
}

shardopt_status shardopt_post_local_sgd_communication(shardopt_post_local_sgd_t plsgd,
                                                      shardopt_communication_counts* out) {
  return guard("shardopt_post_local_sgd_communication",
               [&] { counts_to(checked_plsgd(plsgd, "plsgd").plsgd->communication(), out); });
}

shardopt_status shardopt_post_local_sgd_consolidate_state_dict(shardopt_post_local_sgd_t plsgd, int to) {
  return guard("shardopt_post_local_sgd_consolidate_state_dict",
               [&] { checked_plsgd(plsgd, "plsgd").plsgd->consolidate_state_dict(to); });
}

shardopt_status shardopt_post_local_sgd_state_dict_step(shardopt_post_local_sgd_t plsgd, int32_t* has_step,
                                                        int64_t* step) {
  return guard("shardopt_post_local_sgd_state_dict_step", [&] {
    shardopt_post_local_sgd_s& p = checked_plsgd(plsgd, "plsgd");
    check_not_null(has_step, "has_step");
    check_not_null(step, "step");
    // The C++ state_dict(), so that a rank holding no consolidated dict is refused as there.
    const shardopt::PostLocalSGDStateDict state = p.plsgd->state_dict();
    *has_step = state.has_step ? 1 : 0;
    *step = state.step;
  });
}

}  // extern "C"
