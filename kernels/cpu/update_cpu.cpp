// kernels/cpu/update_cpu.cpp — vectorisable loops over the shared rules, split across OpenMP threads.
//
// The rules' flags are loop-invariant; each is lifted into a template parameter so that the
// inner loop the compiler vectorises has no branches. This file is built with
// -ffp-contract=off: vector body and scalar tail then round identically, which keeps N-rank
// results bitwise equal to 1-rank results whatever the shard boundaries.
#include "cpu/update_cpu.hpp"

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace shardopt {
namespace kernels {
namespace {

// Below this many elements a thread team costs more than it saves.
constexpr int64_t kMinElementsPerThread = 1 << 15;

template <typename Body>
void parallel_ranges(int64_t n, int threads, const Body& body) {
#ifdef _OPENMP
  int team = threads > 0 ? threads : omp_get_max_threads();
  team = static_cast<int>(std::min<int64_t>(team, std::max<int64_t>(1, n / kMinElementsPerThread)));
  if (team > 1) {
#pragma omp parallel num_threads(team)
    {
      const int t = omp_get_thread_num();
      const int count = omp_get_num_threads();
      // Chunk edges on 16-element (64-byte) boundaries so threads never share a cache line.
      const int64_t chunk = ((n + count - 1) / count + 15) / 16 * 16;
      const int64_t begin = std::min<int64_t>(n, t * chunk);
      const int64_t end = std::min<int64_t>(n, begin + chunk);
      if (begin < end) body(begin, end);
    }
    return;
  }
#else
  (void)threads;
#endif
  body(int64_t{0}, n);
}

template <bool kMaximize, bool kWeightDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t begin,
              int64_t end, SgdScalars s) {
  s.maximize = kMaximize;
  s.use_momentum = kMomentum;
  s.first_step = kFirst;
  s.nesterov = kNesterov;
  if (!kWeightDecay) s.weight_decay = 0.f;
  const SgdRule rule{s};
  if (kMomentum) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) rule(p[i], g[i], buf[i]);
  } else {
    float unused = 0.f;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      float local = unused;
      rule(p[i], g[i], local);
    }
  }
}

template <bool kMaximize, bool kWeightDecay, bool kMomentum, bool kFirst>
void sgd_dispatch_nesterov(float* p, const float* g, float* buf, int64_t b, int64_t e,
                           const SgdScalars& s) {
  if (s.nesterov) sgd_loop<kMaximize, kWeightDecay, kMomentum, kFirst, true>(p, g, buf, b, e, s);
  else sgd_loop<kMaximize, kWeightDecay, kMomentum, kFirst, false>(p, g, buf, b, e, s);
}

template <bool kMaximize, bool kWeightDecay>
void sgd_dispatch_momentum(float* p, const float* g, float* buf, int64_t b, int64_t e,
                           const SgdScalars& s) {
  if (!s.use_momentum) sgd_loop<kMaximize, kWeightDecay, false, false, false>(p, g, buf, b, e, s);
  else if (s.first_step) sgd_dispatch_nesterov<kMaximize, kWeightDecay, true, true>(p, g, buf, b, e, s);
  else sgd_dispatch_nesterov<kMaximize, kWeightDecay, true, false>(p, g, buf, b, e, s);
}

template <bool kMaximize, bool kDecoupled, bool kWeightDecay, bool kAmsgrad>
void adam_loop(float* __restrict p, const float* __restrict g, float* __restrict m,
               float* __restrict v, float* __restrict vmax, int64_t begin, int64_t end,
               AdamScalars s) {
  s.maximize = kMaximize;
  s.decoupled = kDecoupled;
  s.amsgrad = kAmsgrad;
  if (!kWeightDecay) s.weight_decay = 0.f;
  const AdamRule rule{s};
  if (kAmsgrad) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) rule(p[i], g[i], m[i], v[i], vmax[i]);
  } else {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      float unused = 0.f;
      rule(p[i], g[i], m[i], v[i], unused);
    }
  }
}

template <bool kMaximize, bool kDecoupled>
void adam_dispatch_tail(float* p, const float* g, float* m, float* v, float* vmax, int64_t b,
                        int64_t e, const AdamScalars& s) {
  const bool wd = !kDecoupled && s.weight_decay != 0.f;
  if (wd) {
    if (s.amsgrad) adam_loop<kMaximize, kDecoupled, true, true>(p, g, m, v, vmax, b, e, s);
    else adam_loop<kMaximize, kDecoupled, true, false>(p, g, m, v, vmax, b, e, s);
  } else {
    if (s.amsgrad) adam_loop<kMaximize, kDecoupled, false, true>(p, g, m, v, vmax, b, e, s);
    else adam_loop<kMaximize, kDecoupled, false, false>(p, g, m, v, vmax, b, e, s);
  }
}

}  // namespace

void sgd_update_cpu(float* param, const float* grad, float* momentum_buf, int64_t n,
                    const SgdScalars& s, int threads) {
  if (n <= 0) return;
  parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
    const bool wd = s.weight_decay != 0.f;
    if (s.maximize) {
      if (wd) sgd_dispatch_momentum<true, true>(param, grad, momentum_buf, b, e, s);
      else sgd_dispatch_momentum<true, false>(param, grad, momentum_buf, b, e, s);
    } else {
      if (wd) sgd_dispatch_momentum<false, true>(param, grad, momentum_buf, b, e, s);
      else sgd_dispatch_momentum<false, false>(param, grad, momentum_buf, b, e, s);
    }
  });
}

void adam_update_cpu(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s, int threads) {
  if (n <= 0) return;
  parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
    if (s.maximize) {
      if (s.decoupled) adam_dispatch_tail<true, true>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, b, e, s);
      else adam_dispatch_tail<true, false>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, b, e, s);
    } else {
      if (s.decoupled) adam_dispatch_tail<false, true>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, b, e, s);
      else adam_dispatch_tail<false, false>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, b, e, s);
    }
  });
}

}  // namespace kernels
}  // namespace shardopt
