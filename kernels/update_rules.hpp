// kernels/update_rules.hpp — the per-element SGD/Adam/AdamW rules: one source of truth for CPU and CUDA.
//
// Each rule follows torch.optim's single-tensor formulas (foreach=False) operation by operation
// in float32, without fused multiply-adds: bitwise equal to torch's non-vectorised CPU kernels
// (torch 1.13); torch's AVX2 kernels fuse some steps into FMAs and differ by an ulp or so. Per-step scalars (bias corrections, step size, decay
// factor) are computed once on the host in double, as Python does, and rounded to float
// where torch rounds them.
#pragma once

#include <cmath>
#include <cstdint>

#include "numerics/host_device.hpp"

namespace shardopt {
namespace kernels {

struct SgdScalars {
  float lr = 0.f;
  float momentum = 0.f;
  float one_minus_dampening = 1.f;
  float weight_decay = 0.f;
  bool use_momentum = false;
  bool first_step = false;  // momentum buffer does not exist yet: torch clones d_p into it
  bool nesterov = false;
  bool maximize = false;
};

// p -= lr * d, where d = g (+ wd*p), through the momentum buffer when momentum != 0.
struct SgdRule {
  SgdScalars s;
  SHARDOPT_HOST_DEVICE void operator()(float& p, float g, float& buf) const {
    float d = s.maximize ? -g : g;
    if (s.weight_decay != 0.f) d = d + s.weight_decay * p;
    if (s.use_momentum) {
      float b = s.first_step ? d : buf * s.momentum + s.one_minus_dampening * d;
      buf = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p = p + (-s.lr) * d;
  }
};

struct AdamScalars {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float weight_decay = 0.f;       // Adam: L2 into the gradient
  float decay_factor = 1.f;       // AdamW: p *= 1 - lr*wd before the update
  float neg_step_size = 0.f;      // -lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.f;  // sqrt(1 - beta2^t)
  bool decoupled = false;         // AdamW
  bool amsgrad = false;
  bool maximize = false;
};

struct AdamRule {
  AdamScalars s;
  // `vmax` is only touched with amsgrad.
  SHARDOPT_HOST_DEVICE void operator()(float& p, float g, float& m, float& v, float& vmax) const {
    float grad = s.maximize ? -g : g;
    float param = p;
    if (s.decoupled) {
      param = param * s.decay_factor;
    } else if (s.weight_decay != 0.f) {
      grad = grad + s.weight_decay * param;
    }
    float m_new = m * s.beta1;
    m_new = m_new + s.one_minus_beta1 * grad;
    float v_new = v * s.beta2;
    v_new = v_new + s.one_minus_beta2 * grad * grad;
    m = m_new;
    v = v_new;
    float v_hat = v_new;
    if (s.amsgrad) {
      float vm = vmax > v_new ? vmax : v_new;
      vmax = vm;
      v_hat = vm;
    }
    float denom = sqrtf(v_hat) / s.bias_correction2_sqrt + s.eps;
    // addcdiv_(m, denom, value=-step_size) scales the numerator before dividing.
    p = param + (s.neg_step_size * m_new) / denom;
  }
};

// Scalars for step t (1-based: the step being taken), computed in double like Python does.
inline AdamScalars make_adam_scalars(double lr, double beta1, double beta2, double eps,
                                     double weight_decay, bool decoupled, bool amsgrad,
                                     bool maximize, int64_t t) {
  AdamScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.decoupled = decoupled;
  s.amsgrad = amsgrad;
  s.maximize = maximize;
  s.weight_decay = decoupled ? 0.f : static_cast<float>(weight_decay);
  s.decay_factor = decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.f;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  return s;
}

inline SgdScalars make_sgd_scalars(double lr, double momentum, double dampening,
                                   double weight_decay, bool nesterov, bool maximize,
                                   bool first_step) {
  SgdScalars s;
  s.lr = static_cast<float>(lr);
  s.momentum = static_cast<float>(momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - dampening);
  s.weight_decay = static_cast<float>(weight_decay);
  s.use_momentum = momentum != 0.0;
  s.first_step = first_step;
  s.nesterov = nesterov;
  s.maximize = maximize;
  return s;
}

}  // namespace kernels
}  // namespace shardopt
