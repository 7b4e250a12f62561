// kernels/cpu/stream_cpu.cpp — the bandwidth probes' loops (see stream_cpu.hpp), split over threads exactly as the update kernels split theirs; compiled once per ISA variant, as they are.
#include "cpu/cpu_variant.hpp"

#include "cpu/loop_support.hpp"
#include "precision.hpp"

SHARDOPT_CPU_VARIANT_BEGIN
namespace {

using cpu_loops::parallel_ranges;
using cpu_loops::walk_in_parts;

// Every probe walks each thread's range in parts, as the node average does: a probe must see
// the most the machine moves, or a kernel that walks better looks faster than memory.
template <typename Body>
void probe_ranges(int64_t n, int threads, const Body& body) {
  parallel_ranges(n, threads, [&](int64_t lo, int64_t hi) { walk_in_parts(lo, hi, body); });
}

// A 16-bit stream with a trivial conversion each way: only the bytes moved matter here.
inline float widen16(uint16_t h) { return bf16_to_float(h); }
inline uint16_t narrow16(float x) { return static_cast<uint16_t>(float_bits(x) >> 16); }

}  // namespace

void stream_copy(const float* a, float* c, int64_t n, int threads) {
  probe_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) c[i] = a[i];
  });
}

void stream_triad(float* a, const float* b, const float* c, float s, int64_t n, int threads) {
  probe_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
  });
}

void fill_f32(float* x, float value, int64_t n, int threads) {
  parallel_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) x[i] = value;
  });
}

void fill_u16(uint16_t* x, uint16_t value, int64_t n, int threads) {
  parallel_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) x[i] = value;
  });
}

namespace {

// Each pattern in a function of its own with __restrict arrays, as the update kernels' loops
// are: without it the compiler must assume the arrays overlap, and the probe measures a slower
// loop than the kernel it stands for.
void adam_pattern(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                  int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float mi = 0.9f * m[i] + 0.1f * g[i];
    const float vi = 0.999f * v[i] + 0.001f * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - 1e-3f * mi * vi;
  }
}

void sgd_momentum_pattern(float* __restrict p, const float* __restrict g, float* __restrict m, int64_t lo,
                          int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float mi = 0.9f * m[i] + g[i];
    m[i] = mi;
    p[i] = p[i] - 1e-3f * mi;
  }
}

void sgd_pattern(float* __restrict p, const float* __restrict g, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) p[i] = p[i] - 1e-3f * g[i];
}

}  // namespace

void update_pattern(UpdatePattern pattern, float* p, const float* g, float* m, float* v, int64_t n, int threads) {
  probe_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    switch (pattern) {
      case UpdatePattern::adam: adam_pattern(p, g, m, v, lo, hi); break;
      case UpdatePattern::sgd_momentum: sgd_momentum_pattern(p, g, m, lo, hi); break;
      case UpdatePattern::sgd: sgd_pattern(p, g, lo, hi); break;
    }
  });
}

void update_pattern_half(UpdatePattern pattern, float* master, const uint16_t* g16, uint16_t* p16, float* m,
                         float* v, int64_t n, int threads) {
  probe_ranges(n, threads, [&](int64_t lo, int64_t hi) {
    switch (pattern) {
      case UpdatePattern::adam:
        for (int64_t i = lo; i < hi; ++i) {
          const float g = widen16(g16[i]);
          const float mi = 0.9f * m[i] + 0.1f * g;
          const float vi = 0.999f * v[i] + 0.001f * g * g;
          m[i] = mi;
          v[i] = vi;
          const float p = master[i] - 1e-3f * mi * vi;
          master[i] = p;
          p16[i] = narrow16(p);
        }
        break;
      case UpdatePattern::sgd_momentum:
        for (int64_t i = lo; i < hi; ++i) {
          const float mi = 0.9f * m[i] + widen16(g16[i]);
          m[i] = mi;
          const float p = master[i] - 1e-3f * mi;
          master[i] = p;
          p16[i] = narrow16(p);
        }
        break;
      case UpdatePattern::sgd:
        for (int64_t i = lo; i < hi; ++i) {
          const float p = master[i] - 1e-3f * widen16(g16[i]);
          master[i] = p;
          p16[i] = narrow16(p);
        }
        break;
    }
  });
}

SHARDOPT_CPU_VARIANT_END
