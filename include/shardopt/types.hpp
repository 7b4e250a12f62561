// shardopt/types.hpp — element types, devices and the non-owning TensorRef view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "shardopt/export.hpp"

namespace shardopt {

// byte: raw bytes for collectives that move records (broadcast, all_gather); no arithmetic,
// so every reduction refuses it.
enum class DType : int32_t { f32 = 0, bf16 = 1, f16 = 2, byte = 3 };

inline constexpr std::size_t dtype_size(DType dtype) {
  return dtype == DType::f32 ? 4 : dtype == DType::byte ? 1 : 2;
}
SHARDOPT_API const char* dtype_name(DType dtype);

struct Device {
  enum class Kind : int32_t { cpu = 0, cuda = 1 };
  Kind kind = Kind::cpu;
  int32_t index = 0;

  static constexpr Device cpu() { return Device{Kind::cpu, 0}; }
  static constexpr Device cuda(int32_t index) { return Device{Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  friend bool operator==(Device a, Device b) {
    return a.kind == b.kind && (a.kind == Kind::cpu || a.index == b.index);
  }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};
SHARDOPT_API std::string device_name(Device device);  // "cpu", "cuda:1"

// The instruction set the CPU kernels run with in this process: "baseline" (x86-64: SSE2),
// "avx2" (AVX2+FMA+F16C) or "avx512" (F, BW, VL, DQ). Chosen once, at the first kernel use,
// from the CPU's features; the environment variable SHARDOPT_CPU_ISA=baseline|avx2|avx512|auto
// forces one. Every choice gives the same bits: it changes speed only. Throws
// Error(unsupported) when SHARDOPT_CPU_ISA names one this CPU (or build) lacks, and
// Error(invalid_argument) for an unknown name, as every CPU kernel call then does.
SHARDOPT_API const char* cpu_kernel_isa();

// A non-owning view of a contiguous buffer that lives in someone else's memory.
struct TensorRef {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();

  std::size_t nbytes() const { return static_cast<std::size_t>(numel) * dtype_size(dtype); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

}  // namespace shardopt
