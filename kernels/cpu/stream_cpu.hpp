// kernels/cpu/stream_cpu.hpp — memory-bandwidth probes (STREAM copy and triad, the update rules' access patterns) compiled and dispatched exactly like the update kernels, for an honest roofline.
#pragma once

#include <cstdint>

namespace shardopt {
namespace kernels {

// The update rule's memory access pattern with trivial arithmetic: the same streams, read and
// written, as the step's kernel (adam: p, g, m, v read, p, m, v written).
enum class UpdatePattern { adam, sgd_momentum, sgd };

// Every loop runs `threads` OpenMP threads (<= 0: the OpenMP default) under a static schedule,
// as the update kernels do, so pages first touched by fill_cpu sit where they are used.
// c[i] = a[i] (8 B per element).
void stream_copy_cpu(const float* a, float* c, int64_t n, int threads);
// a[i] = b[i] + s * c[i] (12 B per element).
void stream_triad_cpu(float* a, const float* b, const float* c, float s, int64_t n, int threads);
// x[i] = value, with the kernels' static schedule (first touch).
void fill_cpu(float* x, float value, int64_t n, int threads);
void fill_cpu(uint16_t* x, uint16_t value, int64_t n, int threads);
// f32 parameters: p, g (read), m, v state as the pattern needs (unused ones may be null).
void update_pattern_cpu(UpdatePattern pattern, float* p, const float* g, float* m, float* v, int64_t n,
                        int threads);
// 16-bit parameters: the fp32 master, a 16-bit gradient read and a 16-bit parameter written.
void update_pattern_half_cpu(UpdatePattern pattern, float* master, const uint16_t* g16, uint16_t* p16, float* m,
                             float* v, int64_t n, int threads);

}  // namespace kernels
}  // namespace shardopt
