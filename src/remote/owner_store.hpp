// src/remote/owner_store.hpp — an owner's rows of its parameters, their optimizer state, the f32 sums of the contexts pushed to it, and the fused update that applies one context.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <cstdlib>
#include <memory>
#include <vector>

#include "remote/directory.hpp"
#include "remote/push_log.hpp"
#include "remote/wire.hpp"

namespace shardopt {
namespace remote {

using Clock = std::chrono::steady_clock;

// This owner's rows [row_begin, row_end) of one parameter, with torch's per-parameter state.
struct OwnedSlice {
  int32_t param = -1;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t row_size = 1;
  Algorithm algorithm = Algorithm::adam;
  Hyperparams hyper;
  std::vector<float> values;
  std::vector<float> exp_avg, exp_avg_sq, max_exp_avg_sq, momentum;  // allocated at the first step
  std::vector<float> dense_grad;  // a sparse sum scattered for a dense update; zero between steps
  int64_t step = 0;
  bool has_momentum_buffer = false;
  int64_t numel() const { return (row_end - row_begin) * row_size; }
  int64_t first_element() const { return row_begin * row_size; }
};

class SumPool;

// The f32 sum of what a context pushed for one parameter, over this owner's rows: every element
// starts at 0 and adds each push in order. Sparse (the rows pushed, in first-push order) until a
// dense push makes it dense, so a context holds what was pushed, not the whole table. Its
// buffers come from, and go back to, the owner's SumPool.
struct ParamSum {
  bool dense = false;
  std::vector<float> values;               // dense: the slice; sparse: rows.size() rows
  std::vector<int64_t> rows;               // sparse: global rows, in first-push order
  // sparse: per row of the slice, 1 + its index in rows (0: not pushed); null until a row is.
  int32_t* slot = nullptr;
  int64_t slot_count = 0;
  int64_t slot_base = 0;  // the slice's first row
  SumPool* pool = nullptr;

  ParamSum() = default;
  ParamSum(const ParamSum&) = delete;
  ParamSum& operator=(const ParamSum&) = delete;
  ~ParamSum();
  float* row(const OwnedSlice& s, int64_t r);  // the row's sum, created at zero when new
  void make_dense(const OwnedSlice& s);
  int64_t bytes() const;
};

// Buffers of sums that were applied or dropped, kept for the next contexts: a context then
// neither faults in fresh pages nor grows its rows by copying (both cost more than the sums).
// At most kKept of each kind are kept (so an owner holds, beyond its open contexts, at most 4
// row tables of 4 bytes per row of a slice and 4 row buffers, each as large as the rows one
// context pushed), until the optimizer is destroyed; a row table goes back all zero (its pushed
// rows cleared), so taking one costs nothing.
class SumPool {
 public:
  static constexpr std::size_t kKept = 4;
  SumPool() = default;
  SumPool(const SumPool&) = delete;
  SumPool& operator=(const SumPool&) = delete;
  ~SumPool();
  int32_t* take_slots(int64_t count);  // zeroed; Error(out_of_memory) when none can be had
  std::vector<float> take_values();    // empty, with the capacity it had
  std::vector<int64_t> take_rows();
  void give(ParamSum& sum);            // takes its buffers (the row table's pushed rows cleared)
  int64_t bytes() const;               // what the kept buffers hold (their capacity)

 private:
  std::vector<std::pair<int32_t*, int64_t>> slots_;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<int64_t>> rows_;
};

// One trainer's context as this owner holds it: the f32 sums of what was pushed into it, and the
// pushes received but not yet summed (the service sums them, in arrival order, when idle, at the
// step, or at once past RemoteOptions::push_log_bytes).
struct OwnerContext {
  Clock::time_point last_activity = Clock::now();
  bool stepped = false;  // its step arrived (waiting for its turn): it no longer expires
  std::map<int32_t, ParamSum> sums;  // by parameter
  PushLog log;
  int32_t error_code = 0;  // the first push this owner refused (then nothing of it is applied)
  std::string error;
  int64_t bytes() const;
};

class OwnerStore {
 public:
  // `initial[i]` holds entries[i]'s values (null: zeros).
  OwnerStore(const Directory& directory, const std::vector<OwnedEntry>& entries,
             const std::vector<const float*>& initial, int threads);

  OwnedSlice* slice(int32_t param);  // null when this rank owns none of it
  std::vector<OwnedSlice>& slices() { return slices_; }

  // Error(invalid_argument) naming what is wrong with a push of `h` (its rows: `rows`): an
  // unknown parameter, elements or rows outside this owner's. Every push is checked here on
  // arrival, once; nothing is added.
  void check_push(const RequestHeader& h, const int64_t* rows);
  // Adds a push that check_push accepted into `context` (an allocation that fails, or a
  // context past its distinct-row limit, raises; nothing added).
  void add_dense(OwnerContext& context, const RequestHeader& header, const float* values);
  void add_rows(OwnerContext& context, const RequestHeader& header, const int64_t* rows, const float* values);
  // One step of every parameter in `touched` that this owner holds, over the context's sums
  // (zeros where it received none; `context` may be null).
  void apply(const OwnerContext* context, const int32_t* touched, int64_t count);
  // Elements [offset, offset + count) of `param` (global element offsets) / the rows named.
  void read(int32_t param, int64_t offset, int64_t count, float* out);
  void read_rows(int32_t param, const int64_t* rows, int64_t count, float* out);
  // Bytes of applied contexts' buffers kept for the next contexts (no side effects).
  int64_t pooled_bytes() const { return pool_.bytes(); }

 private:
  OwnedSlice& checked_slice(int32_t param, const char* what);
  void update(OwnedSlice& slice, const float* grad);
  // SGD without momentum or weight decay leaves rows whose gradient is zero as they are (bit for
  // bit), so a sparse sum updates its rows alone.
  void update_rows(OwnedSlice& slice, const ParamSum& sum);

  std::vector<OwnedSlice> slices_;
  std::vector<int32_t> index_;  // directory id -> slices_ index, -1 when not owned
  std::vector<float> zeros_;    // a gradient of zeros (grown as needed)
  std::vector<float> rows_in_;  // update_rows' gathered parameter rows
  std::vector<int32_t> at_;     // add_rows: each pushed row's place in the sum
  SumPool pool_;
  int threads_;
};

}  // namespace remote
}  // namespace shardopt
