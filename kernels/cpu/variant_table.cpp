// kernels/cpu/variant_table.cpp — one ISA variant's table of kernel entry points (compiled once per variant, like the loops).
#include "cpu/cpu_variant.hpp"

// Data only: no target region is needed (Clang warns about an unused one).
namespace shardopt {
namespace kernels {
namespace SHARDOPT_CPU_NS {

// Constant-initialised (function addresses only): usable before any static constructor runs.
const CpuKernelTable kernel_table = {
    SHARDOPT_CPU_VARIANT_ISA, &sgd_update, &adam_update, &adam_update_q8, &grad_stats, &widen, &narrow, &divide, &average_slots,
    &stream_copy, &stream_triad, &fill_f32, &fill_u16, &update_pattern, &update_pattern_half,
};

}  // namespace SHARDOPT_CPU_NS
}  // namespace kernels
}  // namespace shardopt
