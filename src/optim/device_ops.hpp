// src/optim/device_ops.hpp — every device operation the optimizer makes (buffers, copies, waits, streams, events, kernel launches) behind one interface: CUDA in the library, a counting host implementation in the CPU tests.
//
// DeviceContext routes all of its device work through one DeviceOps, so a test that gives it a
// host implementation (tests/mpi/host_device_ops.hpp) runs the device path of a step (the
// stream and event ordering, the workspaces, the pipelined sync) on the CPU and counts what it
// asked of the device: how many allocations, host synchronisations, streams and events a step
// makes. Streams and events are opaque `void*` (a cudaStream_t / cudaEvent_t on CUDA). Every
// call only enqueues on its stream, except synchronize, which blocks the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/flat_buffer.hpp"
#include "cpu/muon_cpu.hpp"
#include "mixed_update.hpp"
#include "q8_state.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace optim {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // A zero-filled buffer (the zero fill enqueued on `stream`).
  virtual core::FlatBuffer new_buffer(int64_t numel, DType dtype, void* stream) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  virtual void zero(void* dst, std::size_t bytes, void* stream) = 0;
  // Blocks the host until `stream`'s work has finished.
  virtual void synchronize(void* stream, const char* why) = 0;

  virtual void* create_stream() = 0;
  virtual void destroy_stream(void* stream) noexcept = 0;
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  virtual void record_event(void* event, void* stream) = 0;
  // Work enqueued on `stream` from now on waits for the event's last record (on the device).
  virtual void stream_wait_event(void* stream, void* event) = 0;

  // The kernels (contracts of kernels::sgd_update_cuda and the others).
  virtual void sgd_update(const kernels::UpdateTensors& t, float* momentum_buf, int64_t n,
                          const kernels::SgdScalars& s, const kernels::GradTransform& gt,
                          const kernels::Rounding& r, void* stream) = 0;
  virtual void adam_update(const kernels::UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                           float* max_exp_avg_sq, int64_t n, const kernels::AdamScalars& s,
                           const kernels::GradTransform& gt, const kernels::Rounding& r, void* stream) = 0;
  // Adam/AdamW over 8-bit blockwise moments (kernels::adam_update_q8_cuda's contract).
  // Error(unsupported) where an implementation has none.
  virtual void adam_update_q8(const kernels::UpdateTensors& t, const kernels::Q8Moments& q, int64_t n,
                              const kernels::AdamScalars& s, const kernels::GradTransform& gt,
                              const kernels::Rounding& r, void* stream);
  // `workspace`: grad_stats_workspace_bytes() of device memory, which the caller keeps (a null
  // workspace would make CUDA allocate one per call).
  virtual void grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm, double* out,
                          bool accumulate, void* workspace, void* stream) = 0;
  virtual std::size_t grad_stats_workspace_bytes() const = 0;
  virtual void divide(void* x, DType dtype, int64_t n, float divisor, void* stream) = 0;
  // bf16/f16 <-> f32 (masters seeded from parameters, parameters set from f32 values).
  virtual void widen(const void* src, DType dtype, float* dst, int64_t n, void* stream) = 0;
  virtual void narrow(const float* src, void* dst, DType dtype, int64_t n, void* stream) = 0;
  // One whole Muon matrix (kernels::muon_update_cuda's contract; the implementation keeps its
  // scratch and cuBLAS handle). Error(unsupported) where an implementation has none.
  virtual void muon_update(const kernels::UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols,
                           const kernels::MuonScalars& s, const kernels::GradTransform& gt,
                           const kernels::Rounding& r, kernels::MuonPrecision precision, void* stream);
};

// The CUDA implementation on `device`, keeping the kernels' launch parameters (SM count,
// occupancy) from their first launch on. Error(unsupported) in a build without CUDA.
std::unique_ptr<DeviceOps> make_cuda_device_ops(Device device);

}  // namespace optim
}  // namespace shardopt
