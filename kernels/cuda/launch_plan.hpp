// kernels/cuda/launch_plan.hpp — how one launch splits [0,n) into a scalar head, a float4 body and a scalar tail.
//
// Plain C++: every function is SHARDOPT_HOST_DEVICE, so the CUDA kernels index through exactly
// this code and a host build (tests/gpu/test_cuda_launch_plan_host.cpp) runs the same code to
// check every branch without a GPU.
//
// A plan is a list of "items". Item i is either one element (scalar) or four consecutive
// elements read and written with one 16-byte access (vector). Items are numbered head first,
// then the body, then the tail, and thread t of a grid with S threads in total handles items
// t, t+S, t+2S, ... (a grid-stride loop), so one launch of any grid size covers any n.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace shardopt {
namespace kernels {

constexpr int kVectorWidth = 4;   // floats per vector item
constexpr int kVectorBytes = 16;  // bytes per vector access (float4)

struct VectorPlan {
  int64_t n = 0;        // elements in the range
  int64_t head = 0;     // scalar items for elements [0, head)
  int64_t vectors = 0;  // vector items for elements [head, head + 4*vectors)
  // The scalar tail is elements [tail_begin(), n): fewer than kVectorWidth of them.

  SHARDOPT_HOST_DEVICE int64_t tail_begin() const { return head + kVectorWidth * vectors; }
  SHARDOPT_HOST_DEVICE int64_t tail() const { return n - tail_begin(); }
  SHARDOPT_HOST_DEVICE int64_t items() const { return head + vectors + tail(); }
  SHARDOPT_HOST_DEVICE bool vectorized() const { return vectors > 0; }
};

// One unit of work: `width` consecutive elements starting at `first` (width 1 or kVectorWidth).
struct PlanItem {
  int64_t first = 0;
  int width = 1;
};

// Plans [0,n) over `count` streams starting at `addresses` (byte addresses of element 0), whose
// elements are `element_bytes[k]` bytes wide (4 for float, 2 for bf16/f16; null: all floats):
// a vector item touches 4 elements of each stream, one 16-byte access for floats, one 8-byte
// access for 16-bit elements. The body is used only when every stream is aligned to its element size and
// sits at the same element offset from a vector boundary; the head then runs each stream up
// to that boundary. Other streams (misaligned relative to each other, or not even aligned to
// their element size) are planned as scalar items only: still one launch, and the same
// rounding, since vector and scalar items apply the same rule to each element.
SHARDOPT_HOST_DEVICE VectorPlan make_vector_plan(int64_t n, const std::uintptr_t* addresses,
                                                 const int* element_bytes, int count) {
  VectorPlan plan;
  if (n <= 0) return plan;
  plan.n = n;
  bool vectorizable = true;
  std::uintptr_t phase = 0;  // element offset from the previous vector boundary, shared by all
  for (int k = 0; k < count; ++k) {
    const std::uintptr_t size =
        element_bytes ? static_cast<std::uintptr_t>(element_bytes[k]) : sizeof(float);
    const std::uintptr_t stream_phase = addresses[k] / size % kVectorWidth;
    vectorizable = vectorizable && addresses[k] % size == 0 && (k == 0 || stream_phase == phase);
    if (k == 0) phase = stream_phase;
  }
  if (!vectorizable) {
    plan.head = n;
    return plan;
  }
  const int64_t to_boundary = static_cast<int64_t>((kVectorWidth - phase) % kVectorWidth);
  plan.head = to_boundary < n ? to_boundary : n;
  plan.vectors = (n - plan.head) / kVectorWidth;
  return plan;
}

// The same for `count` float streams.
SHARDOPT_HOST_DEVICE VectorPlan make_vector_plan(int64_t n, const std::uintptr_t* addresses,
                                                 int count) {
  return make_vector_plan(n, addresses, nullptr, count);
}

// Item i of the plan, for 0 <= i < plan.items().
SHARDOPT_HOST_DEVICE PlanItem plan_item(const VectorPlan& plan, int64_t i) {
  if (i < plan.head) return PlanItem{i, 1};
  const int64_t j = i - plan.head;
  if (j < plan.vectors) return PlanItem{plan.head + kVectorWidth * j, kVectorWidth};
  return PlanItem{plan.tail_begin() + (j - plan.vectors), 1};
}

struct GridShape {
  int64_t blocks = 0;  // 0: nothing to launch
  int threads = 0;     // per block
};

// Enough blocks to give every item its own thread, capped at `max_blocks`; the grid-stride
// loop covers the rest. The cap is what keeps a huge shard at one launch of a sane size.
SHARDOPT_HOST_DEVICE GridShape make_grid_shape(int64_t items, int threads_per_block,
                                               int64_t max_blocks) {
  GridShape grid;
  if (items <= 0 || threads_per_block <= 0) return grid;
  grid.threads = threads_per_block;
  const int64_t wanted = (items + threads_per_block - 1) / threads_per_block;
  const int64_t cap = max_blocks > 0 ? max_blocks : 1;
  grid.blocks = wanted < cap ? wanted : cap;
  return grid;
}

// The first item of thread `thread` in block `block`, and the stride of the grid-stride loop.
SHARDOPT_HOST_DEVICE int64_t grid_stride_first(int64_t block, int64_t threads_per_block,
                                               int64_t thread) {
  return block * threads_per_block + thread;
}
SHARDOPT_HOST_DEVICE int64_t grid_stride_step(int64_t blocks, int64_t threads_per_block) {
  return blocks * threads_per_block;
}

// The loop every plan kernel runs for one thread: `op(PlanItem)` on each of its items.
template <typename Op>
SHARDOPT_HOST_DEVICE void run_plan_items(const VectorPlan& plan, int64_t first, int64_t step,
                                         const Op& op) {
  const int64_t items = plan.items();
  for (int64_t i = first; i < items; i += step) op(plan_item(plan, i));
}

}  // namespace kernels
}  // namespace shardopt
