// kernels/cpu/blas_core.cpp — checks OpenBLAS's core against this CPU once per process and, where OpenBLAS fell back to a generic core, re-runs its core selection with the one the CPU runs.
#include "cpu/blas_core.hpp"

#include <cctype>
#include <cstdlib>
#include <mutex>

#include <cblas.h>
#include <dlfcn.h>

namespace shardopt {
namespace kernels {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// 2: AVX-512 kernels, 1: AVX2 + FMA kernels, 0: older or unknown to us.
int core_tier(const std::string& core) {
  const std::string name = lower(core);
  if (name == "skylakex" || name == "cooperlake" || name == "sapphirerapids") return 2;
  if (name == "haswell" || name == "zen") return 1;
  return 0;
}

std::string current_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

// OpenBLAS's own core selection, from the library our cblas calls bind to (found by address, so
// a library loaded locally, as under Python, is found too). Empty where OpenBLAS was built for
// one core (no DYNAMIC_ARCH) or the target core's kernels were not built in.
struct CoreSelection {
  void (*quit)() = nullptr;  // gotoblas_dynamic_quit: forget the core
  void (*init)() = nullptr;  // gotoblas_dynamic_init: pick one (OPENBLAS_CORETYPE, else the CPU model)
};

template <typename Function>
Function symbol_as(void* library, const char* name) {
  return reinterpret_cast<Function>(dlsym(library, name));
}

CoreSelection find_core_selection(const std::string& core, std::string& why_not) {
  CoreSelection selection;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&openblas_get_corename), &info) == 0 || info.dli_fname == nullptr) {
    why_not = "OpenBLAS's library file cannot be found from its symbols";
    return selection;
  }
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) {
    why_not = std::string("OpenBLAS (") + info.dli_fname + ") cannot be reopened";
    return selection;
  }
  const std::string table = "gotoblas_" + [&] {
    std::string upper = core;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return upper;
  }();
  selection.quit = symbol_as<void (*)()>(library, "gotoblas_dynamic_quit");
  selection.init = symbol_as<void (*)()>(library, "gotoblas_dynamic_init");
  const bool has_table = dlsym(library, table.c_str()) != nullptr;
  dlclose(library);  // linked in: stays loaded
  if (selection.quit == nullptr || selection.init == nullptr || !has_table) {
    why_not = std::string("OpenBLAS (") + info.dli_fname + ") has no run-time core selection with " + core +
              " (built for one core)";
    selection = CoreSelection{};
  }
  return selection;
}

BlasCore choose_blas_core() {
  BlasCore result;
  result.picked_at_load = current_core();
  result.in_use = result.picked_at_load;
  const char* user_choice = std::getenv("OPENBLAS_CORETYPE");
  if (user_choice != nullptr && *user_choice != '\0') {
    result.why = std::string("OPENBLAS_CORETYPE=") + user_choice + " set by the user: kept";
    return result;
  }
  const std::string wanted = blas_core_for(detect_cpu_features());
  if (wanted.empty() || blas_core_at_least(result.picked_at_load, wanted)) {
    result.why = "OpenBLAS's own choice for this CPU";
    return result;
  }
  std::string why_not;
  const CoreSelection selection = find_core_selection(wanted, why_not);
  if (selection.init == nullptr) {
    result.why = "OpenBLAS fell back to " + result.picked_at_load + " on this CPU (it runs " + wanted +
                 "'s kernels) and kept it: " + why_not;
    return result;
  }
  // OpenBLAS reads OPENBLAS_CORETYPE only in its core selection; set it for that call alone.
  setenv("OPENBLAS_CORETYPE", wanted.c_str(), 1);
  selection.quit();
  selection.init();
  unsetenv("OPENBLAS_CORETYPE");
  result.in_use = current_core();
  result.switched = result.in_use != result.picked_at_load;
  result.why = "OpenBLAS fell back to " + result.picked_at_load + " on this CPU; switched to " + result.in_use +
               " (the CPU runs " + wanted + "'s kernels)";
  return result;
}

}  // namespace

std::string blas_core_for(const CpuFeatures& cpu) {
  if (cpu_runs_isa(CpuIsa::avx512, cpu)) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  return "";
}

bool blas_core_at_least(const std::string& core, const std::string& wanted) {
  return core_tier(core) >= core_tier(wanted);
}

const BlasCore& ensure_blas_core() {
  static std::once_flag once;
  static BlasCore core;
  std::call_once(once, [] { core = choose_blas_core(); });
  return core;
}

}  // namespace kernels
}  // namespace shardopt
