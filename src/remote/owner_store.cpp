// src/remote/owner_store.cpp — accumulating pushes in f32 and applying a context with the fused CPU kernels (the ZeroOptimizer's update rules and scalars).
#include "remote/owner_store.hpp"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
#include "remote/staging.hpp"

namespace shardopt {
namespace remote {

ParamSum::~ParamSum() {
  if (pool != nullptr) pool->give(*this);
  std::free(slot);
}

float* ParamSum::row(const OwnedSlice& s, int64_t r) {
  if (dense) return values.data() + (r - s.row_begin) * s.row_size;
  if (slot == nullptr) {
    slot_count = s.row_end - s.row_begin;
    slot_base = s.row_begin;
    slot = pool != nullptr ? pool->take_slots(slot_count)
                           : static_cast<int32_t*>(std::calloc(static_cast<std::size_t>(slot_count), sizeof(int32_t)));
    SHARDOPT_CHECK(slot != nullptr, out_of_memory, "push_rows: {} bytes for the rows index of a context",
                   slot_count * 4);
  }
  int32_t& at = slot[r - s.row_begin];
  if (at != 0) return values.data() + static_cast<int64_t>(at - 1) * s.row_size;
  SHARDOPT_CHECK(rows.size() < static_cast<std::size_t>(INT32_MAX - 1), unsupported,
                 "push_rows: a context holds more than {} distinct rows of one parameter", INT32_MAX - 1);
  at = static_cast<int32_t>(rows.size()) + 1;
  rows.push_back(r);
  values.resize(values.size() + static_cast<std::size_t>(s.row_size), 0.f);
  return values.data() + (static_cast<int64_t>(rows.size()) - 1) * s.row_size;
}

void ParamSum::make_dense(const OwnedSlice& s) {
  if (dense) return;
  std::vector<float> full(static_cast<std::size_t>(s.numel()), 0.f);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    std::memcpy(full.data() + (rows[k] - s.row_begin) * s.row_size, values.data() + static_cast<int64_t>(k) * s.row_size,
                static_cast<std::size_t>(s.row_size) * sizeof(float));
  }
  if (pool != nullptr) pool->give(*this);  // the sparse buffers, now unused
  std::free(slot);
  slot = nullptr;
  values = std::move(full);
  rows.clear();
  dense = true;
}

SumPool::~SumPool() {
  for (auto& s : slots_) std::free(s.first);
}

int32_t* SumPool::take_slots(int64_t count) {
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (it->second != count) continue;
    int32_t* slot = it->first;
    slots_.erase(it);
    return slot;
  }
  return static_cast<int32_t*>(std::calloc(static_cast<std::size_t>(count), sizeof(int32_t)));
}

std::vector<float> SumPool::take_values() {
  if (values_.empty()) return {};
  std::vector<float> v = std::move(values_.back());
  values_.pop_back();
  return v;
}

std::vector<int64_t> SumPool::take_rows() {
  if (rows_.empty()) return {};
  std::vector<int64_t> v = std::move(rows_.back());
  rows_.pop_back();
  return v;
}

void SumPool::give(ParamSum& sum) {
  if (sum.slot != nullptr && slots_.size() < kKept) {
    for (int64_t r : sum.rows) sum.slot[r - sum.slot_base] = 0;  // back to all zero
    slots_.emplace_back(sum.slot, sum.slot_count);
    sum.slot = nullptr;
  }
  if (!sum.dense && sum.values.capacity() > 0 && values_.size() < kKept) {
    sum.values.clear();
    values_.push_back(std::move(sum.values));
  }
  if (sum.rows.capacity() > 0 && rows_.size() < kKept) {
    sum.rows.clear();
    rows_.push_back(std::move(sum.rows));
  }
  sum.values = {};
  sum.rows = {};
}

int64_t SumPool::bytes() const {
  int64_t total = 0;
  for (const auto& s : slots_) total += s.second * static_cast<int64_t>(sizeof(int32_t));
  for (const auto& v : values_) total += static_cast<int64_t>(v.capacity() * sizeof(float));
  for (const auto& r : rows_) total += static_cast<int64_t>(r.capacity() * sizeof(int64_t));
  return total;
}

int64_t ParamSum::bytes() const {
  // The rows index counts as the pages its pushed rows touched, at most.
  return static_cast<int64_t>(values.size() * sizeof(float) + rows.size() * (sizeof(int64_t) + sizeof(int32_t)));
}

int64_t OwnerContext::bytes() const {
  int64_t total = 0;
  for (const auto& sum : sums) total += sum.second.bytes();
  return total + log.bytes();
}

OwnerStore::OwnerStore(const Directory& directory, const std::vector<OwnedEntry>& entries,
                       const std::vector<const float*>& initial, int threads)
    : index_(directory.size(), -1), threads_(threads) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const OwnedEntry& e = entries[i];
    OwnedSlice s;
    s.param = directory.find(e.name);
    s.row_begin = e.row_begin;
    s.row_end = e.row_end;
    s.row_size = e.row_size;
    s.algorithm = e.algorithm;
    s.hyper = e.hyper;
    s.values.assign(static_cast<std::size_t>(s.numel()), 0.f);
    if (initial[i] != nullptr) {  // host memory, or CUDA device memory copied through the host
      const HostView host(initial[i], s.values.size() * sizeof(float), fmt::format("the initial values of '{}'", e.name));
      std::memcpy(s.values.data(), host.data(), s.values.size() * sizeof(float));
    }
    index_[static_cast<std::size_t>(s.param)] = static_cast<int32_t>(slices_.size());
    slices_.push_back(std::move(s));
  }
}

OwnedSlice* OwnerStore::slice(int32_t param) {
  if (param < 0 || static_cast<std::size_t>(param) >= index_.size() || index_[static_cast<std::size_t>(param)] < 0) {
    return nullptr;
  }
  return &slices_[static_cast<std::size_t>(index_[static_cast<std::size_t>(param)])];
}

OwnedSlice& OwnerStore::checked_slice(int32_t param, const char* what) {
  OwnedSlice* s = slice(param);
  SHARDOPT_CHECK(s != nullptr, invalid_argument, "{}: parameter id {} has no rows on this owner", what, param);
  return *s;
}

void OwnerStore::check_push(const RequestHeader& h, const int64_t* rows) {
  if (h.kind == RequestKind::push_dense) {
    const OwnedSlice& s = checked_slice(h.param, "push");
    SHARDOPT_CHECK(h.count >= 0 && h.offset >= s.first_element() && h.offset + h.count <= s.first_element() + s.numel(),
                   invalid_argument, "push: elements [{}, {}) are not within this owner's [{}, {})", h.offset,
                   h.offset + h.count, s.first_element(), s.first_element() + s.numel());
    return;
  }
  const OwnedSlice& s = checked_slice(h.param, "push_rows");
  for (int64_t i = 0; i < h.count; ++i) {
    SHARDOPT_CHECK(rows[i] >= s.row_begin && rows[i] < s.row_end, invalid_argument,
                   "push_rows: row {} is not among this owner's rows [{}, {})", rows[i], s.row_begin, s.row_end);
  }
}

void OwnerStore::add_dense(OwnerContext& context, const RequestHeader& h, const float* values) {
  OwnedSlice& s = checked_slice(h.param, "push");  // its range was checked on arrival (check_push)
  ParamSum& sum = context.sums[h.param];
  sum.make_dense(s);
  float* at = sum.values.data() + (h.offset - s.first_element());
  for (int64_t i = 0; i < h.count; ++i) at[i] += values[i];
}

void OwnerStore::add_rows(OwnerContext& context, const RequestHeader& h, const int64_t* rows, const float* values) {
  OwnedSlice& s = checked_slice(h.param, "push_rows");  // its rows were checked on arrival (check_push)
  ParamSum& sum = context.sums[h.param];
  if (sum.pool == nullptr && !sum.dense) {  // new: its buffers from those of applied contexts
    sum.pool = &pool_;
    sum.values = pool_.take_values();
    sum.rows = pool_.take_rows();
  }
  if (sum.dense) {
    for (int64_t i = 0; i < h.count; ++i) {
      float* row = sum.row(s, rows[i]);
      const float* in = values + i * s.row_size;
      for (int64_t j = 0; j < s.row_size; ++j) row[j] += in[j];
    }
    return;
  }
  if (h.count == 0) return;  // the parameter counts as pushed (an entry), with no rows
  // Two passes: first every row's place in the sum (new rows appended; the row table's loads,
  // prefetched ahead, are the random accesses), then the adds, in push order.
  if (sum.slot == nullptr) sum.row(s, rows[0]);  // the row table, and the first row
  SHARDOPT_CHECK(sum.rows.size() + static_cast<std::size_t>(h.count) < static_cast<std::size_t>(INT32_MAX - 1),
                 unsupported, "push_rows: a context holds more than {} distinct rows of one parameter", INT32_MAX - 1);
  at_.resize(static_cast<std::size_t>(h.count));
  int32_t* slot = sum.slot;  // indexed by row - row_begin
  const int64_t first = s.row_begin;
  constexpr int64_t kAhead = 16;
  for (int64_t i = 0; i < h.count; ++i) {
    if (i + kAhead < h.count) __builtin_prefetch(slot + (rows[i + kAhead] - first), 1);
    int32_t& at = slot[rows[i] - first];
    if (at == 0) {
      sum.rows.push_back(rows[i]);
      at = static_cast<int32_t>(sum.rows.size());
    }
    at_[static_cast<std::size_t>(i)] = at - 1;
  }
  sum.values.resize(sum.rows.size() * static_cast<std::size_t>(s.row_size), 0.f);
  float* base = sum.values.data();
  const int64_t n = s.row_size;
  for (int64_t i = 0; i < h.count; ++i) {
    if (i + kAhead < h.count) __builtin_prefetch(base + at_[static_cast<std::size_t>(i + kAhead)] * n, 1);
    float* row = base + at_[static_cast<std::size_t>(i)] * n;
    const float* in = values + i * n;
    for (int64_t j = 0; j < n; ++j) row[j] += in[j];
  }
}

void OwnerStore::apply(const OwnerContext* context, const int32_t* touched, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    OwnedSlice* s = slice(touched[i]);
    if (s == nullptr) continue;
    const ParamSum* sum = nullptr;
    if (context != nullptr) {
      const auto found = context->sums.find(touched[i]);
      if (found != context->sums.end()) sum = &found->second;
    }
    const Hyperparams& h = s->hyper;
    const bool zero_rows_unchanged = s->algorithm == Algorithm::sgd && h.momentum == 0.0 && h.weight_decay == 0.0;
    if (sum != nullptr && !sum->dense && zero_rows_unchanged) {
      update_rows(*s, *sum);
      continue;
    }
    if (sum != nullptr && sum->dense) {
      update(*s, sum->values.data());
      continue;
    }
    if (sum == nullptr) {
      if (zeros_.size() < static_cast<std::size_t>(s->numel())) zeros_.assign(static_cast<std::size_t>(s->numel()), 0.f);
      update(*s, zeros_.data());
      continue;
    }
    // A sparse sum under a rule that changes every row: scattered into the slice's dense
    // gradient (kept at zero between steps), updated, and those rows zeroed again.
    if (s->dense_grad.empty()) s->dense_grad.assign(static_cast<std::size_t>(s->numel()), 0.f);
    const std::size_t row_bytes = static_cast<std::size_t>(s->row_size) * sizeof(float);
    for (std::size_t k = 0; k < sum->rows.size(); ++k) {
      std::memcpy(s->dense_grad.data() + (sum->rows[k] - s->row_begin) * s->row_size,
                  sum->values.data() + static_cast<int64_t>(k) * s->row_size, row_bytes);
    }
    update(*s, s->dense_grad.data());
    for (int64_t r : sum->rows) std::memset(s->dense_grad.data() + (r - s->row_begin) * s->row_size, 0, row_bytes);
  }
}

// In blocks of rows: each block's parameter rows are gathered (prefetched ahead), updated by the
// fused kernel (elementwise, so blocking changes no bit), and written back while still in cache.
void OwnerStore::update_rows(OwnedSlice& s, const ParamSum& sum) {
  const std::size_t row_bytes = static_cast<std::size_t>(s.row_size) * sizeof(float);
  const Hyperparams& h = s.hyper;
  const kernels::SgdScalars scalars =
      kernels::make_sgd_scalars(h.lr, 0.0, h.dampening, 0.0, h.nesterov, h.maximize, !s.has_momentum_buffer);
  const std::size_t count = sum.rows.size();
  const std::size_t block = std::max<std::size_t>(1, (64 << 10) / row_bytes);  // ~64 kB of rows
  rows_in_.resize(std::min(count, block) * static_cast<std::size_t>(s.row_size));
  const auto row_of = [&](std::size_t k) { return s.values.data() + (sum.rows[k] - s.row_begin) * s.row_size; };
  for (std::size_t first = 0; first < count; first += block) {
    const std::size_t n = std::min(block, count - first);
    for (std::size_t k = 0; k < n; ++k) {
      if (first + k + 16 < count) __builtin_prefetch(row_of(first + k + 16), 1);
      std::memcpy(rows_in_.data() + static_cast<int64_t>(k) * s.row_size, row_of(first + k), row_bytes);
    }
    kernels::sgd_update_cpu(rows_in_.data(), sum.values.data() + first * static_cast<std::size_t>(s.row_size), nullptr,
                            static_cast<int64_t>(n) * s.row_size, scalars, 1);
    for (std::size_t k = 0; k < n; ++k) {
      std::memcpy(row_of(first + k), rows_in_.data() + static_cast<int64_t>(k) * s.row_size, row_bytes);
    }
  }
  ++s.step;
}

// The update of step.cpp's Step::update_range for f32 parameters: the same scalars, kernels and
// step counting, so an owner's rows end on the bits a ZeroOptimizer gives them.
void OwnerStore::update(OwnedSlice& s, const float* grad) {
  const std::size_t n = static_cast<std::size_t>(s.numel());
  const Hyperparams& h = s.hyper;
  if (s.algorithm == Algorithm::sgd) {
    if (s.momentum.empty()) s.momentum.assign(n, 0.f);
    const kernels::SgdScalars scalars = kernels::make_sgd_scalars(h.lr, h.momentum, h.dampening, h.weight_decay,
                                                                  h.nesterov, h.maximize, !s.has_momentum_buffer);
    kernels::sgd_update_cpu(s.values.data(), grad, s.momentum.data(), s.numel(), scalars, threads_);
    if (h.momentum != 0.0) s.has_momentum_buffer = true;
  } else {
    if (s.exp_avg.empty()) {
      s.exp_avg.assign(n, 0.f);
      s.exp_avg_sq.assign(n, 0.f);
    }
    if (h.amsgrad && s.max_exp_avg_sq.empty()) s.max_exp_avg_sq.assign(n, 0.f);
    const kernels::AdamScalars scalars =
        kernels::make_adam_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, s.algorithm == Algorithm::adamw,
                                   h.amsgrad, h.maximize, s.step + 1);
    kernels::adam_update_cpu(s.values.data(), grad, s.exp_avg.data(), s.exp_avg_sq.data(),
                             h.amsgrad ? s.max_exp_avg_sq.data() : nullptr, s.numel(), scalars, threads_);
  }
  ++s.step;
}

void OwnerStore::read(int32_t param, int64_t offset, int64_t count, float* out) {
  OwnedSlice& s = checked_slice(param, "pull");
  SHARDOPT_CHECK(count >= 0 && offset >= s.first_element() && offset + count <= s.first_element() + s.numel(),
                 invalid_argument, "pull: elements [{}, {}) are not within this owner's [{}, {})", offset,
                 offset + count, s.first_element(), s.first_element() + s.numel());
  std::memcpy(out, s.values.data() + (offset - s.first_element()), static_cast<std::size_t>(count) * sizeof(float));
}

void OwnerStore::read_rows(int32_t param, const int64_t* rows, int64_t count, float* out) {
  OwnedSlice& s = checked_slice(param, "pull_rows");
  for (int64_t i = 0; i < count; ++i) {
    SHARDOPT_CHECK(rows[i] >= s.row_begin && rows[i] < s.row_end, invalid_argument,
                   "pull_rows: row {} is not among this owner's rows [{}, {})", rows[i], s.row_begin, s.row_end);
  }
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(out + i * s.row_size, s.values.data() + (rows[i] - s.row_begin) * s.row_size,
                static_cast<std::size_t>(s.row_size) * sizeof(float));
  }
}

}  // namespace remote
}  // namespace shardopt
