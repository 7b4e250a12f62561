// kernels/cpu/kernel_table.cpp — finds the table of a compiled ISA variant, and caches the one this process uses.
#include "cpu/kernel_table.hpp"

#include "kernel_check.hpp"

namespace shardopt {
namespace kernels {

// Defined by kernels/cpu/variant_table.cpp, compiled once per variant.
namespace cpu_baseline {
extern const CpuKernelTable kernel_table;
}  // namespace cpu_baseline
#if defined(SHARDOPT_CPU_X86_VARIANTS)
namespace cpu_avx2 {
extern const CpuKernelTable kernel_table;
}  // namespace cpu_avx2
namespace cpu_avx512 {
extern const CpuKernelTable kernel_table;
}  // namespace cpu_avx512
#endif

namespace {

const CpuKernelTable* compiled_table(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline: return &cpu_baseline::kernel_table;
#if defined(SHARDOPT_CPU_X86_VARIANTS)
    case CpuIsa::avx2: return &cpu_avx2::kernel_table;
    case CpuIsa::avx512: return &cpu_avx512::kernel_table;
#else
    case CpuIsa::avx2:
    case CpuIsa::avx512:
      break;
#endif
  }
  return nullptr;
}

}  // namespace

const CpuKernelTable& cpu_kernel_table(CpuIsa isa) {
  const CpuKernelTable* table = compiled_table(isa);
  SHARDOPT_KERNEL_CHECK(table != nullptr, unsupported, "this build of shardopt has no {} CPU kernels",
                        cpu_isa_name(isa));
  const CpuFeatures cpu = detect_cpu_features();
  SHARDOPT_KERNEL_CHECK(cpu_runs_isa(isa, cpu), unsupported, "this CPU cannot run the {} kernels (it lacks {})",
                        cpu_isa_name(isa), missing_cpu_features(isa, cpu));
  return *table;
}

const CpuKernelTable& active_cpu_kernels() {
  // Thread-safe static initialisation: decided once, never re-checked per call.
  static const CpuKernelTable& table = cpu_kernel_table(active_cpu_isa());
  return table;
}

}  // namespace kernels
}  // namespace shardopt
