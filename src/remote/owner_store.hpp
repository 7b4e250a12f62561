// src/remote/owner_store.hpp — an owner's rows of its parameters, their optimizer state, the f32 sums of the contexts pushed to it, and the fused update that applies one context.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "remote/directory.hpp"
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
  int64_t step = 0;
  bool has_momentum_buffer = false;
  int64_t numel() const { return (row_end - row_begin) * row_size; }
  int64_t first_element() const { return row_begin * row_size; }
};

// One trainer's context as this owner holds it: the f32 sums of what was pushed into it.
struct OwnerContext {
  Clock::time_point last_activity = Clock::now();
  bool stepped = false;  // its step arrived (waiting for its turn): it no longer expires
  std::map<int32_t, std::vector<float>> sums;  // by parameter, over this owner's rows
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

  // Adds a push into `context` (Error(invalid_argument) naming what is wrong; nothing added).
  void add_dense(OwnerContext& context, const RequestHeader& header, const float* values);
  void add_rows(OwnerContext& context, const RequestHeader& header, const int64_t* rows, const float* values);
  // One step of every parameter in `touched` that this owner holds, over the context's sums
  // (zeros where it received none; `context` may be null).
  void apply(const OwnerContext* context, const int32_t* touched, int64_t count);
  // Elements [offset, offset + count) of `param` (global element offsets) / the rows named.
  void read(int32_t param, int64_t offset, int64_t count, float* out);
  void read_rows(int32_t param, const int64_t* rows, int64_t count, float* out);

 private:
  OwnedSlice& checked_slice(int32_t param, const char* what);
  void update(OwnedSlice& slice, const float* grad);

  std::vector<OwnedSlice> slices_;
  std::vector<int32_t> index_;  // directory id -> slices_ index, -1 when not owned
  std::vector<float> zeros_;
  int threads_;
};

}  // namespace remote
}  // namespace shardopt
