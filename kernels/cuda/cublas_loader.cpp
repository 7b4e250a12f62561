// kernels/cuda/cublas_loader.cpp — dlopen of libcublas.so.<major> and the table of the cuBLAS functions Muon's Newton-Schulz calls.
#include "cuda/cublas_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "kernel_check.hpp"

namespace shardopt {
namespace kernels {
namespace {

struct Loaded {
  CublasTable table;
  std::string failure;
};

std::string cublas_library_name() {
  const char* chosen = std::getenv("SHARDOPT_CUBLAS_LIBRARY");
  if (chosen != nullptr && *chosen != '\0') return chosen;
  return fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
}

// The handle is never closed: cuBLAS handles may live until the process exits.
Loaded load() {
  Loaded loaded;
  const std::string library = cublas_library_name();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    loaded.failure = fmt::format("{} (install the CUDA {} toolkit's cuBLAS, put the directory holding {} on "
                                 "LD_LIBRARY_PATH, or name the file in SHARDOPT_CUBLAS_LIBRARY)",
                                 why != nullptr ? why : library, CUBLAS_VER_MAJOR, library);
    return loaded;
  }
  const auto resolve = [&](auto& slot, const char* name) {
    if (!loaded.failure.empty()) return;
    void* symbol = dlsym(handle, name);
    if (symbol == nullptr) {
      loaded.failure = fmt::format("{} has no {}", library, name);
      return;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
  };
  CublasTable& t = loaded.table;
  resolve(t.create, "cublasCreate_v2");
  resolve(t.destroy, "cublasDestroy_v2");
  resolve(t.set_stream, "cublasSetStream_v2");
  resolve(t.set_math_mode, "cublasSetMathMode");
  resolve(t.sgemm, "cublasSgemm_v2");
  resolve(t.ssyrk, "cublasSsyrk_v2");
  resolve(t.gemm_ex, "cublasGemmEx");
  if (!loaded.failure.empty()) loaded.table = CublasTable{};  // all or nothing
  return loaded;
}

const Loaded& loaded_cublas() {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace

const std::string& cublas_load_failure() { return loaded_cublas().failure; }

const CublasTable& cublas_table(const char* who) {
  const Loaded& loaded = loaded_cublas();
  if (!loaded.failure.empty()) raise_error(ErrorCode::unsupported, "{}: cuBLAS cannot be loaded: {}", who, loaded.failure);
  return loaded.table;
}

}  // namespace kernels
}  // namespace shardopt
