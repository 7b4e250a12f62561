// numerics/host_device.hpp — SHARDOPT_HOST_DEVICE: marks a function for host and device code, force-inlined (the one definition).
//
// numerics/ is a leaf: it includes nothing but the standard library, so both kernels/ and
// src/ may use it without depending on each other.
#pragma once

// Always inlined on the host too: the CPU loops only vectorise once every per-element helper
// is inlined, and with many instantiations GCC's inlining heuristics give up on some.
#if defined(__CUDACC__)
#define SHARDOPT_HOST_DEVICE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define SHARDOPT_HOST_DEVICE inline __attribute__((always_inline))
#else
#define SHARDOPT_HOST_DEVICE inline
#endif
