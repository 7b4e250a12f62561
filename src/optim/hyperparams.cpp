// src/optim/hyperparams.cpp — the same range checks torch.optim's constructors make, and NaN checks.
#include "optim/hyperparams.hpp"

#include <cmath>

#include "core/check.hpp"

namespace shardopt {
namespace optim {
namespace {

void check_finite_at_least(double value, double low, const char* field, const std::string& where) {
  SHARDOPT_CHECK(std::isfinite(value) && value >= low, invalid_argument,
                 "{}: invalid {} {} (must be a finite number >= {})", where, field, value, low);
}

void check_beta(double value, const char* field, const std::string& where) {
  SHARDOPT_CHECK(std::isfinite(value) && value >= 0.0 && value < 1.0, invalid_argument,
                 "{}: invalid {} {} (must be in [0, 1))", where, field, value);
}

}  // namespace

void validate_hyperparams(const Hyperparams& hyper, Algorithm algorithm, int group) {
  validate_hyperparams(hyper, algorithm, fmt::format("param group {}", group));
}

void validate_hyperparams(const Hyperparams& hyper, Algorithm algorithm, const std::string& group) {
  check_finite_at_least(hyper.lr, 0.0, "lr", group);
  check_finite_at_least(hyper.weight_decay, 0.0, "weight_decay", group);
  if (algorithm == Algorithm::muon) {
    // torch.optim.Muon's checks, and those its Newton-Schulz makes at the first step.
    check_finite_at_least(hyper.momentum, 0.0, "momentum", group);
    check_finite_at_least(hyper.eps, 0.0, "eps", group);
    SHARDOPT_CHECK(hyper.ns_steps >= 0 && hyper.ns_steps < 100, invalid_argument,
                   "{}: invalid ns_steps {} (must be in [0, 100))", group, hyper.ns_steps);
    for (std::size_t i = 0; i < hyper.ns_coefficients.size(); ++i) {
      SHARDOPT_CHECK(std::isfinite(hyper.ns_coefficients[i]), invalid_argument,
                     "{}: invalid ns_coefficients[{}] {} (must be finite)", group, i, hyper.ns_coefficients[i]);
    }
    const int adjust = static_cast<int>(hyper.adjust_lr_fn);
    SHARDOPT_CHECK(adjust >= 0 && adjust <= 3, invalid_argument,
                   "{}: invalid adjust_lr_fn {} (must be none, original, match_rms_adamw or spectral_unclamped)",
                   group, adjust);
    SHARDOPT_CHECK(!hyper.maximize, invalid_argument, "{}: Muon has no maximize (torch.optim.Muon neither)", group);
    return;
  }
  if (algorithm == Algorithm::sgd) {
    check_finite_at_least(hyper.momentum, 0.0, "momentum", group);
    SHARDOPT_CHECK(std::isfinite(hyper.dampening), invalid_argument,
                   "{}: invalid dampening {} (must be finite)", group, hyper.dampening);
    SHARDOPT_CHECK(!hyper.nesterov || (hyper.momentum > 0.0 && hyper.dampening == 0.0),
                   invalid_argument,
                   "{}: nesterov momentum requires momentum > 0 and dampening == 0 "
                   "(got momentum {}, dampening {})",
                   group, hyper.momentum, hyper.dampening);
  } else {
    check_finite_at_least(hyper.eps, 0.0, "eps", group);
    check_beta(hyper.beta1, "beta1", group);
    check_beta(hyper.beta2, "beta2", group);
  }
}

}  // namespace optim

Hyperparams default_hyperparams(Algorithm algorithm) {
  Hyperparams h;
  if (algorithm == Algorithm::adamw) h.weight_decay = 1e-2;  // torch.optim.AdamW's default
  if (algorithm == Algorithm::muon) {  // torch.optim.Muon's
    h.weight_decay = 0.1;
    h.momentum = 0.95;
    h.nesterov = true;
    h.eps = 1e-7;
  }
  return h;
}

GroupHyperparams::GroupHyperparams(const Hyperparams& all)
    : lr(all.lr), beta1(all.beta1), beta2(all.beta2), eps(all.eps), weight_decay(all.weight_decay),
      momentum(all.momentum), dampening(all.dampening), nesterov(all.nesterov), maximize(all.maximize),
      amsgrad(all.amsgrad), ns_coefficients(all.ns_coefficients), ns_steps(all.ns_steps),
      adjust_lr_fn(all.adjust_lr_fn) {}

Hyperparams GroupHyperparams::resolve(const Hyperparams& defaults) const {
  Hyperparams h;
  h.lr = lr.value_or(defaults.lr);
  h.beta1 = beta1.value_or(defaults.beta1);
  h.beta2 = beta2.value_or(defaults.beta2);
  h.eps = eps.value_or(defaults.eps);
  h.weight_decay = weight_decay.value_or(defaults.weight_decay);
  h.momentum = momentum.value_or(defaults.momentum);
  h.dampening = dampening.value_or(defaults.dampening);
  h.nesterov = nesterov.value_or(defaults.nesterov);
  h.maximize = maximize.value_or(defaults.maximize);
  h.amsgrad = amsgrad.value_or(defaults.amsgrad);
  h.ns_coefficients = ns_coefficients.value_or(defaults.ns_coefficients);
  h.ns_steps = ns_steps.value_or(defaults.ns_steps);
  h.adjust_lr_fn = adjust_lr_fn.value_or(defaults.adjust_lr_fn);
  return h;
}

}  // namespace shardopt
