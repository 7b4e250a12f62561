// kernels/cpu/cpu_isa.cpp — CPU feature detection and the choice of the kernels' ISA variant (SHARDOPT_CPU_ISA), made once per process.
//
// Compiled once, for the baseline: it runs before anything knows what the CPU supports.
#include "cpu/cpu_isa.hpp"

#include <cctype>
#include <cstdlib>
#include <string>

#include "kernel_check.hpp"
#include "shardopt/types.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define SHARDOPT_CPU_HAVE_CPUID 1
#else
#define SHARDOPT_CPU_HAVE_CPUID 0
#endif

namespace shardopt {
namespace kernels {
namespace {

struct FeatureRequirement {
  const char* name;
  bool CpuFeatures::*present;
};

constexpr FeatureRequirement kAvx2Needs[] = {
    {"avx2", &CpuFeatures::avx2}, {"fma", &CpuFeatures::fma}, {"f16c", &CpuFeatures::f16c}};
constexpr FeatureRequirement kAvx512Needs[] = {
    {"avx2", &CpuFeatures::avx2},         {"fma", &CpuFeatures::fma},
    {"f16c", &CpuFeatures::f16c},         {"avx512f", &CpuFeatures::avx512f},
    {"avx512bw", &CpuFeatures::avx512bw}, {"avx512vl", &CpuFeatures::avx512vl},
    {"avx512dq", &CpuFeatures::avx512dq}};

// Calls f(requirement) for each feature `isa` needs (none for the baseline).
template <typename F>
void for_each_requirement(CpuIsa isa, const F& f) {
  if (isa == CpuIsa::avx2) {
    for (const FeatureRequirement& r : kAvx2Needs) f(r);
  } else if (isa == CpuIsa::avx512) {
    for (const FeatureRequirement& r : kAvx512Needs) f(r);
  }
}

CpuIsa isa_at(int index) { return static_cast<CpuIsa>(index); }

// "baseline, avx2": the compiled variants for which keep(isa) holds.
template <typename Keep>
std::string isa_list(const Keep& keep) {
  std::string list;
  for (int i = 0; i < kCpuIsaCount; ++i) {
    if (!cpu_isa_compiled(isa_at(i)) || !keep(isa_at(i))) continue;
    if (!list.empty()) list += ", ";
    list += cpu_isa_name(isa_at(i));
  }
  return list;
}

std::string runnable_list(const CpuFeatures& cpu) {
  return isa_list([&](CpuIsa isa) { return cpu_runs_isa(isa, cpu); });
}

std::string lowercase(const char* s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return "baseline";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "unknown-isa";
}

CpuFeatures detect_cpu_features() {
  CpuFeatures cpu;
#if SHARDOPT_CPU_HAVE_CPUID
  // From CPUID directly rather than __builtin_cpu_supports, whose feature names differ between
  // compilers (Clang 14 has no "f16c"). The CPU's bits alone are not enough: the OS must also
  // save the YMM (and, for AVX-512, the opmask and ZMM) registers, which XCR0 says.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return cpu;
  const bool osxsave = (ecx & (1u << 27)) != 0;
  const bool avx = (ecx & (1u << 28)) != 0;
  const bool fma = (ecx & (1u << 12)) != 0;
  const bool f16c = (ecx & (1u << 29)) != 0;
  if (!osxsave || !avx) return cpu;
  unsigned xcr0 = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  const bool ymm_state = (xcr0 & 0x6u) == 0x6u;     // SSE and AVX state
  const bool zmm_state = (xcr0 & 0xe6u) == 0xe6u;   // and opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return cpu;
  cpu.avx2 = (ebx & (1u << 5)) != 0;
  cpu.fma = fma;
  cpu.f16c = f16c;
  if (zmm_state) {
    cpu.avx512f = (ebx & (1u << 16)) != 0;
    cpu.avx512dq = (ebx & (1u << 17)) != 0;
    cpu.avx512bw = (ebx & (1u << 30)) != 0;
    cpu.avx512vl = (ebx & (1u << 31)) != 0;
  }
#endif
  return cpu;
}

bool cpu_isa_compiled(CpuIsa isa) {
#if defined(SHARDOPT_CPU_X86_VARIANTS)
  return isa == CpuIsa::baseline || isa == CpuIsa::avx2 || isa == CpuIsa::avx512;
#else
  return isa == CpuIsa::baseline;
#endif
}

bool cpu_runs_isa(CpuIsa isa, const CpuFeatures& cpu) { return missing_cpu_features(isa, cpu).empty(); }

std::string missing_cpu_features(CpuIsa isa, const CpuFeatures& cpu) {
  std::string missing;
  for_each_requirement(isa, [&](const FeatureRequirement& r) {
    if (cpu.*(r.present)) return;
    if (!missing.empty()) missing += ' ';
    missing += r.name;
  });
  return missing;
}

CpuIsa select_cpu_isa(const char* requested, const CpuFeatures& cpu) {
  const std::string name = requested ? lowercase(requested) : std::string();
  if (name.empty() || name == "auto") {
    for (int i = kCpuIsaCount - 1; i > 0; --i) {
      if (cpu_isa_compiled(isa_at(i)) && cpu_runs_isa(isa_at(i), cpu)) return isa_at(i);
    }
    return CpuIsa::baseline;
  }
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = isa_at(i);
    if (name != cpu_isa_name(isa)) continue;
    SHARDOPT_KERNEL_CHECK(cpu_isa_compiled(isa), unsupported,
                          "SHARDOPT_CPU_ISA={}: this build of shardopt has no {} kernels (it has: {})",
                          requested, name, isa_list([](CpuIsa) { return true; }));
    SHARDOPT_KERNEL_CHECK(cpu_runs_isa(isa, cpu), unsupported,
                          "SHARDOPT_CPU_ISA={}: this CPU cannot run the {} kernels (it lacks {}); it runs: {}",
                          requested, name, missing_cpu_features(isa, cpu), runnable_list(cpu));
    return isa;
  }
  raise_error(ErrorCode::invalid_argument,
              "SHARDOPT_CPU_ISA={}: unknown; use baseline, avx2, avx512 or auto (unset: auto)", requested);
}

CpuIsa active_cpu_isa() {
  // A throwing initializer leaves the static uninitialised: the next call tries again.
  static const CpuIsa isa = select_cpu_isa(std::getenv("SHARDOPT_CPU_ISA"), detect_cpu_features());
  return isa;
}

const char* active_cpu_isa_name() { return cpu_isa_name(active_cpu_isa()); }

}  // namespace kernels

const char* cpu_kernel_isa() { return kernels::active_cpu_isa_name(); }

}  // namespace shardopt
