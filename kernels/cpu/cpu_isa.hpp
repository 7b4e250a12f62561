// kernels/cpu/cpu_isa.hpp — the instruction sets the CPU kernels are compiled for, what this CPU runs, and the one chosen at start (SHARDOPT_CPU_ISA).
//
// The loops are compiled once per variant (kernels/cpu/cpu_variant.hpp); every variant gives
// the same bits, so the choice changes speed only, and a run resumed on a machine with another
// ISA continues bitwise. The choice is made once per process, on first use, and cached.
#pragma once

#include <string>

namespace shardopt {
namespace kernels {

// In order of preference: a later one is faster where the CPU runs it.
enum class CpuIsa : int {
  baseline = 0,  // the build's own target (x86-64: SSE2; arm64: NEON)
  avx2 = 1,      // AVX2 + FMA + F16C (FMA is never contracted into: same bits)
  avx512 = 2,    // AVX-512 F, BW, VL, DQ on top of avx2
};
constexpr int kCpuIsaCount = 3;

// "baseline", "avx2", "avx512".
const char* cpu_isa_name(CpuIsa isa);

// The CPU features the variants need, as this process sees them (the OS must also save the
// wider registers: the feature checks include that).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
};

// This machine's features (all false off x86).
CpuFeatures detect_cpu_features();

// Whether this build compiled a variant for `isa` (x86-64 builds with GCC or Clang: all three;
// otherwise baseline only).
bool cpu_isa_compiled(CpuIsa isa);

// Whether a CPU with `cpu` can run `isa`'s code; missing_cpu_features names what it lacks
// ("avx512f avx512bw"), empty when it can.
bool cpu_runs_isa(CpuIsa isa, const CpuFeatures& cpu);
std::string missing_cpu_features(CpuIsa isa, const CpuFeatures& cpu);

// The variant to use for a requested SHARDOPT_CPU_ISA value: null, empty or "auto" -> the
// fastest one that is compiled and that `cpu` runs; "baseline", "avx2", "avx512" (any case) ->
// that one, or Error(unsupported) naming it, what is missing and what the CPU runs instead;
// any other value -> Error(invalid_argument) listing the accepted ones.
CpuIsa select_cpu_isa(const char* requested, const CpuFeatures& cpu);

// The variant this process uses: select_cpu_isa(getenv("SHARDOPT_CPU_ISA"), this CPU),
// computed on the first call (thread-safe) and cached. Throws what select_cpu_isa throws, on
// every call until the environment is fixed (kernel calls never start with an ISA the CPU
// lacks: no illegal instruction).
CpuIsa active_cpu_isa();
const char* active_cpu_isa_name();

}  // namespace kernels
}  // namespace shardopt
