// kernels/cuda/cublas_loader.hpp — cuBLAS loaded at run time (dlopen), so that libshardopt loads and runs without it, and Muon on CUDA says by name where it is missing.
//
// Only Muon's Newton-Schulz on CUDA parameters uses cuBLAS. Linking it would make every
// program that loads libshardopt need libcublas.so (tests/install checks it does not), so the
// few functions used are resolved with dlsym from libcublas.so.<the major version this build
// was compiled against>, or the file SHARDOPT_CUBLAS_LIBRARY names.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace shardopt {
namespace kernels {

// The cuBLAS functions shardopt calls, with cublas_api.h's own types.
struct CublasTable {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  decltype(&::cublasSsyrk_v2) ssyrk = nullptr;
  // The C symbol (cublasComputeType_t); C++ also sees an overload taking cudaDataType.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// "" where cuBLAS is loaded and every function resolved (once per process, thread safe);
// otherwise why not (dlopen's or dlsym's words and what to do).
const std::string& cublas_load_failure();

// The table; raises Error(unsupported) with `who` and cublas_load_failure() where it is empty.
const CublasTable& cublas_table(const char* who);

}  // namespace kernels
}  // namespace shardopt
