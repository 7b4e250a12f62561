// tools/bench/stream_roofline.cpp — runs the bandwidth kernels with every rank streaming at once and reports the best repetition, as STREAM does.
#include "stream_roofline.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include <unistd.h>

#include "bench_support.hpp"
#include "precision.hpp"  // kernels/: bf16 <-> float, for the 16-bit streams

namespace shardopt_bench {
namespace {

int64_t last_level_cache_bytes() {
  long bytes = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{32} << 20;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedArray = std::unique_ptr<float, AlignedFree>;

AlignedArray aligned_floats(int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedArray(static_cast<float*>(p));
}

}  // namespace

UpdateShape update_shape(const Options& o) {
  if (o.algorithm != Algorithm::sgd) return UpdateShape::adam;
  return o.momentum != 0.0 ? UpdateShape::sgd_momentum : UpdateShape::sgd;
}

int64_t update_bytes_per_param(UpdateShape shape, DType dtype) {
  const int64_t state = shape == UpdateShape::adam ? 16 : shape == UpdateShape::sgd_momentum ? 8 : 0;
  const int64_t param = dtype == DType::f32 ? 12 : 2 * static_cast<int64_t>(shardopt::dtype_size(dtype)) + 8;
  return param + state;
}

StreamResult measure_stream(Communicator& comm, int threads, int64_t array_mb, UpdateShape shape, DType dtype) {
  StreamResult result;
  const int64_t auto_bytes = std::max<int64_t>(2 * last_level_cache_bytes(), int64_t{64} << 20);
  result.array_bytes = array_mb > 0 ? array_mb << 20 : auto_bytes;
  const int64_t n = result.array_bytes / static_cast<int64_t>(sizeof(float));
  AlignedArray owners[4] = {aligned_floats(n), aligned_floats(n), aligned_floats(n), aligned_floats(n)};
  float* const a = owners[0].get();
  float* const b = owners[1].get();
  float* const c = owners[2].get();
  float* const d = owners[3].get();
  // 16-bit gradient and parameter arrays (mixed precision only).
  const bool half = dtype != DType::f32;
  AlignedArray half_owners[2] = {aligned_floats(half ? (n + 1) / 2 : 1), aligned_floats(half ? (n + 1) / 2 : 1)};
  auto* const g16 = reinterpret_cast<uint16_t*>(half_owners[0].get());
  auto* const p16 = reinterpret_cast<uint16_t*>(half_owners[1].get());
  const int team = effective_threads(threads);
  // First touch by the same static schedule that the kernels use, so each thread's pages are
  // where it runs. Values stay normal floats through every kernel (no denormal slow paths).
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 1.0f;
    b[i] = 2.0f;
    c[i] = 0.5f;
    d[i] = 0.25f;
  }
  if (half) {
#pragma omp parallel for num_threads(team) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      g16[i] = 0x4000u;  // 2.0 as bf16, as b
      p16[i] = 0u;
    }
  }
  // The 16-bit streams with trivial conversions (a shift each way: bf16's, whatever the dtype,
  // as only the bytes moved matter here).
  const auto widen16 = [](uint16_t h) { return shardopt::kernels::bf16_to_float(h); };
  const auto narrow16 = [](float x) { return static_cast<uint16_t>(shardopt::kernels::float_bits(x) >> 16); };
  constexpr int kReps = 6;
  std::vector<double> copy_s, triad_s, update_s;
  auto timed = [&](std::vector<double>& out, const auto& kernel) {
    comm.barrier();
    const auto start = Clock::now();
    kernel();
    out.push_back(seconds_since(start));
  };
  for (int rep = 0; rep < kReps; ++rep) {
    timed(copy_s, [&] {
#pragma omp parallel for num_threads(team) schedule(static)
      for (int64_t i = 0; i < n; ++i) c[i] = a[i];
    });
    timed(triad_s, [&] {
#pragma omp parallel for num_threads(team) schedule(static)
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    });
    // p = a, g = b, m = c, v = d; mixed precision: master = a, g = g16, p = p16.
    timed(update_s, [&] {
      if (half) {
        switch (shape) {
          case UpdateShape::adam:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float g = widen16(g16[i]);
              const float m = 0.9f * c[i] + 0.1f * g;
              const float v = 0.999f * d[i] + 0.001f * g * g;
              c[i] = m;
              d[i] = v;
              const float p = a[i] - 1e-3f * m * v;
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
          case UpdateShape::sgd_momentum:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float m = 0.9f * c[i] + widen16(g16[i]);
              c[i] = m;
              const float p = a[i] - 1e-3f * m;
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
          case UpdateShape::sgd:
#pragma omp parallel for num_threads(team) schedule(static)
            for (int64_t i = 0; i < n; ++i) {
              const float p = a[i] - 1e-3f * widen16(g16[i]);
              a[i] = p;
              p16[i] = narrow16(p);
            }
            break;
        }
        return;
      }
      switch (shape) {
        case UpdateShape::adam:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) {
            const float m = 0.9f * c[i] + 0.1f * b[i];
            const float v = 0.999f * d[i] + 0.001f * b[i] * b[i];
            c[i] = m;
            d[i] = v;
            a[i] = a[i] - 1e-3f * m * v;
          }
          break;
        case UpdateShape::sgd_momentum:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) {
            const float m = 0.9f * c[i] + b[i];
            c[i] = m;
            a[i] = a[i] - 1e-3f * m;
          }
          break;
        case UpdateShape::sgd:
#pragma omp parallel for num_threads(team) schedule(static)
          for (int64_t i = 0; i < n; ++i) a[i] = a[i] - 1e-3f * b[i];
          break;
      }
    });
  }
  // The results are read, so the loops cannot be dropped as dead stores.
  volatile float sink = a[n / 2] + c[n / 3] + d[n / 5] + (half ? widen16(p16[n / 7]) : 0.f);
  (void)sink;
  // The first repetition also pays for warming TLBs and the thread team; STREAM skips it.
  auto best_gbps = [&](const std::vector<double>& seconds, int64_t bytes_per_element) {
    const std::vector<double> slowest = slowest_rank(comm, seconds);
    const double best = *std::min_element(slowest.begin() + 1, slowest.end());
    return static_cast<double>(comm.size()) * static_cast<double>(n) * static_cast<double>(bytes_per_element) / best / 1e9;
  };
  result.copy_gbps = best_gbps(copy_s, 8);
  result.triad_gbps = best_gbps(triad_s, 12);
  result.update_gbps = best_gbps(update_s, update_bytes_per_param(shape, dtype));
  return result;
}

}  // namespace shardopt_bench
