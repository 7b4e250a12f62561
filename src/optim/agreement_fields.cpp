// src/optim/agreement_fields.cpp — config, hyperparameter and registration fields of the agreement records, and the config's validation.
#include "optim/agreement_fields.hpp"

#include <cmath>

#include "core/check.hpp"

namespace shardopt {
namespace optim {
namespace {

const char* storage_name(Storage storage) {
  switch (storage) {
    case Storage::bucket_view: return "bucket_view";
    case Storage::external: return "external";
  }
  return "unknown";
}

std::string text(bool value) { return value ? "true" : "false"; }
template <typename Number>
std::string text(Number value) {
  return fmt::format("{}", value);
}

void add_hyper_fields(const Hyperparams& h, const std::string& prefix, comm::AgreementRecord& record) {
  record.field(prefix + "lr", text(h.lr));
  record.field(prefix + "beta1", text(h.beta1));
  record.field(prefix + "beta2", text(h.beta2));
  record.field(prefix + "eps", text(h.eps));
  record.field(prefix + "weight_decay", text(h.weight_decay));
  record.field(prefix + "momentum", text(h.momentum));
  record.field(prefix + "dampening", text(h.dampening));
  record.field(prefix + "nesterov", text(h.nesterov));
  record.field(prefix + "maximize", text(h.maximize));
  record.field(prefix + "amsgrad", text(h.amsgrad));
  record.field(prefix + "ns_coefficients",
               fmt::format("({}, {}, {})", h.ns_coefficients[0], h.ns_coefficients[1], h.ns_coefficients[2]));
  record.field(prefix + "ns_steps", text(h.ns_steps));
  record.field(prefix + "adjust_lr_fn", muon_lr_adjust_name(h.adjust_lr_fn));
}

}  // namespace

void validate_config(const OptimizerConfig& config) {
  const int algorithm = static_cast<int>(config.algorithm);
  SHARDOPT_CHECK(algorithm >= 0 && algorithm <= 3, invalid_argument,
                 "config.algorithm {} is not sgd, adam, adamw or muon", algorithm);
  const int muon_precision = static_cast<int>(config.muon.precision);
  SHARDOPT_CHECK(muon_precision == 0 || muon_precision == 1, invalid_argument,
                 "config.muon.precision {} is not bf16 or f32", muon_precision);
  SHARDOPT_CHECK(config.muon.blas_threads >= 1, invalid_argument, "config.muon.blas_threads must be >= 1, got {}",
                 config.muon.blas_threads);
  const int partition = static_cast<int>(config.partition);
  SHARDOPT_CHECK(partition == 0 || partition == 1, invalid_argument,
                 "config.partition {} is not flat or sorted_greedy", partition);
  const int storage = static_cast<int>(config.storage);
  SHARDOPT_CHECK(storage == 0 || storage == 1, invalid_argument, "config.storage {} is not bucket_view or external",
                 storage);
  SHARDOPT_CHECK(config.bucket_bytes > 0, invalid_argument, "bucket_bytes must be positive, got {}",
                 config.bucket_bytes);
  SHARDOPT_CHECK(config.pipeline_chunk_bytes >= 0, invalid_argument, "pipeline_chunk_bytes must be >= 0, got {}",
                 config.pipeline_chunk_bytes);
  SHARDOPT_CHECK(config.cpu_threads >= 0, invalid_argument, "cpu_threads must be >= 0, got {}", config.cpu_threads);
  SHARDOPT_CHECK(config.stage == 1 || config.stage == 2, invalid_argument, "stage must be 1 or 2, got {}", config.stage);
  SHARDOPT_CHECK(config.stage == 1 || config.shard_state, invalid_argument,
                 "stage 2 shards gradients by the optimizer state's partition; it needs shard_state = true");
  const int overlap = static_cast<int>(config.overlap);
  SHARDOPT_CHECK(overlap >= 0 && overlap <= 2, invalid_argument,
                 "config.overlap {} is not off, after_backward or per_bucket", overlap);
  SHARDOPT_CHECK(config.overlap == OverlapPolicy::off || config.storage == Storage::bucket_view, invalid_argument,
                 "config.overlap = {} needs storage = bucket_view (gradients handed over in place or copied into "
                 "shardopt's buffers); with external storage reduce_gradients() reads them all at once",
                 overlap_policy_name(config.overlap));
  const LossScaling& ls = config.loss_scaling;
  SHARDOPT_CHECK(config.overlap != OverlapPolicy::per_bucket || !ls.enabled, invalid_argument,
                 "config.overlap = per_bucket updates each bucket as soon as its reduction lands, before any rank "
                 "could know whether a gradient is inf/NaN, so it cannot be combined with loss scaling; use "
                 "overlap = after_backward");
  if (!ls.enabled) return;
  SHARDOPT_CHECK(std::isfinite(ls.init_scale) && ls.init_scale > 0, invalid_argument,
                 "loss_scaling.init_scale must be finite and > 0, got {}", ls.init_scale);
  SHARDOPT_CHECK(std::isfinite(ls.growth_factor) && ls.growth_factor > 1.0, invalid_argument,
                 "loss_scaling.growth_factor must be finite and > 1, got {}", ls.growth_factor);
  SHARDOPT_CHECK(std::isfinite(ls.backoff_factor) && ls.backoff_factor > 0 && ls.backoff_factor < 1.0,
                 invalid_argument, "loss_scaling.backoff_factor must be in (0, 1), got {}", ls.backoff_factor);
  SHARDOPT_CHECK(ls.growth_interval > 0, invalid_argument, "loss_scaling.growth_interval must be > 0, got {}",
                 ls.growth_interval);
  SHARDOPT_CHECK(std::isfinite(ls.min_scale) && ls.min_scale > 0 && ls.min_scale <= ls.init_scale, invalid_argument,
                 "loss_scaling.min_scale must be finite, > 0 and <= init_scale ({}), got {}", ls.init_scale,
                 ls.min_scale);
}

void add_config_fields(const OptimizerConfig& config, comm::AgreementRecord& record) {
  record.field("config.algorithm", algorithm_name(config.algorithm));
  record.field("config.partition", partition_name(config.partition));
  record.field("config.storage", storage_name(config.storage));
  record.field("config.shard_state", text(config.shard_state));
  record.field("config.bucket_bytes", text(config.bucket_bytes));
  record.field("config.pipeline_chunk_bytes", text(config.pipeline_chunk_bytes));
  record.field("config.node_shared_params", text(config.node_shared_params));
  record.field("config.stage", text(config.stage));
  record.field("config.stochastic_rounding", text(config.stochastic_rounding));
  record.field("config.rounding_seed", text(config.rounding_seed));
  record.field("config.state_precision", state_precision_name(config.state_precision));
  record.field("config.master", master_storage_name(config.master));
  const LossScaling& ls = config.loss_scaling;
  record.field("config.loss_scaling.enabled", text(ls.enabled));
  record.field("config.loss_scaling.init_scale", text(ls.init_scale));
  record.field("config.loss_scaling.growth_factor", text(ls.growth_factor));
  record.field("config.loss_scaling.backoff_factor", text(ls.backoff_factor));
  record.field("config.loss_scaling.growth_interval", text(ls.growth_interval));
  record.field("config.loss_scaling.min_scale", text(ls.min_scale));
  record.field("config.divide_by_initial_world_size", text(config.divide_by_initial_world_size));
  record.field("config.overlap", overlap_policy_name(config.overlap));
  record.field("config.muon.precision", config.muon.precision == MatrixPrecision::bf16 ? "bf16" : "f32");
  record.field("config.muon.blas_threads", text(config.muon.blas_threads));
  record.field("config.defaults", config.defaults ? "set" : "unset");
  if (config.defaults) add_hyper_fields(*config.defaults, "config.defaults.", record);
}

void add_group_fields(const Hyperparams& hyper, int group, comm::AgreementRecord& record) {
  add_hyper_fields(hyper, fmt::format("param group {} ", group), record);
}

void add_registration_fields(const Registration& registration, std::size_t first_id, int first_group,
                             comm::AgreementRecord& record) {
  // Groups first: a rank that registered fewer parameters then runs out of fields exactly where
  // it runs out of parameters, and the message names the first one it lacks.
  for (std::size_t g = 0; g < registration.groups.size(); ++g) {
    record.field(fmt::format("param group {} algorithm", first_group + static_cast<int>(g)),
                 algorithm_name(registration.algorithms[g]));
    add_group_fields(registration.groups[g], first_group + static_cast<int>(g), record);
  }
  for (std::size_t g = 0; g < registration.storage.size(); ++g) {
    const std::string group = fmt::format("param group {} ", first_group + static_cast<int>(g));
    record.field(group + "state_precision", state_precision_name(registration.storage[g].state_precision));
    record.field(group + "master", master_storage_name(registration.storage[g].master));
  }
  for (std::size_t i = 0; i < registration.records.size(); ++i) {
    record.field(fmt::format("parameter #{}", first_id + i), describe(registration.records[i]));
  }
}

}  // namespace optim
}  // namespace shardopt
