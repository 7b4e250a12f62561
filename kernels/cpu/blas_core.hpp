// kernels/cpu/blas_core.hpp — which OpenBLAS kernel (core) runs Muon's products, and the switch from a generic fallback to the core this CPU runs.
//
// A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU model when it loads. One older than
// the CPU does not know the model and falls back to a generic core (Debian's 0.3.21 on Sapphire
// and Emerald Rapids Xeons: "Prescott", SSE3, 4-5x slower sgemm than its SkylakeX kernel). The
// first Newton-Schulz of a process therefore checks OpenBLAS's choice against this CPU's
// instruction sets and, where OpenBLAS fell back, re-runs OpenBLAS's own core selection with the
// core the CPU runs, as OPENBLAS_CORETYPE would have at load. A user's OPENBLAS_CORETYPE is
// always kept.
#pragma once

#include <string>

#include "cpu/cpu_isa.hpp"

namespace shardopt {
namespace kernels {

struct BlasCore {
  std::string picked_at_load;  // OpenBLAS's own choice, as openblas_get_corename() named it
  std::string in_use;          // the core the products run on now
  std::string why;             // one line: why in_use is what it is
  bool switched = false;       // in_use differs from picked_at_load
};

// The OpenBLAS core a CPU with `cpu` should run at least: "SkylakeX" (AVX-512 F/BW/VL/DQ),
// "Haswell" (AVX2 + FMA), or "" (nothing to gain over any core).
std::string blas_core_for(const CpuFeatures& cpu);

// Whether `core` (an OpenBLAS core name, any case) already uses the instruction sets that
// `wanted` (blas_core_for's answer) names: SkylakeX, Cooperlake and SapphireRapids are AVX-512
// cores; Haswell and Zen AVX2 ones.
bool blas_core_at_least(const std::string& core, const std::string& wanted);

// Checks OpenBLAS's core once per process (the first call, thread-safe) and switches a fallback
// core as above; later calls return the same answer. The switch is process-wide: every BLAS call
// of the process after it runs on the new core (the same library, the same results up to its
// summation order). It happens at most once, before Muon's first product.
const BlasCore& ensure_blas_core();

}  // namespace kernels
}  // namespace shardopt
