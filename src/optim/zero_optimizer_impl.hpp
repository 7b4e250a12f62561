// src/optim/zero_optimizer_impl.hpp — ZeroOptimizer's internals, shared by the optim and checkpoint modules.
//
// The step pipeline (DESIGN.md): reduce_gradients() averages gradients (stage 1: all-reduce;
// stage 2: reduce to each shard's owner); clip_grad_norm() and loss scaling reduce one or two
// numbers per rank; step() runs the fused update (unscale, clip, rule, master write-back) over
// this rank's shard only, then syncs parameters (one all-gather for the flat partition, one
// broadcast per rank shard for sorted_greedy) in the parameters' dtype. Every rank tracks every
// parameter's step count, so per-step scalars never need communication.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_cuda_support.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "cpu/update_cpu.hpp"
#include "optim/device_update.hpp"
#include "optim/fingerprint.hpp"
#include "core/flat_buffer.hpp"
#include "optim/host_staging.hpp"
#include "optim/state_kinds.hpp"
#include "optim/hyperparams.hpp"
#include "partition/partition.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt {
namespace optim {

// Flat shards start on 16-element (64-byte) boundaries: whole cache lines per rank, and
// 16-byte vector access on devices.
constexpr int64_t kShardAlignment = 16;


struct ParamRecord {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  int32_t group = 0;
  bool trainable = true;
  void* user_param = nullptr;  // external storage only
  void* user_grad = nullptr;
  int64_t first_index = 0;  // position in the concatenation of all params in id order
  int64_t step = 0;
  bool has_momentum_buffer = false;  // torch creates it lazily, cloning d_p the first time
};

// A stretch of this rank's shard that one kernel call updates: consecutive elements of
// params in one group with the same step history.
struct UpdateRun {
  int32_t first_param = 0;  // its step count and group stand for the whole run
  int64_t shard_offset = 0;
  int64_t length = 0;
  char* param = nullptr;
  char* grad = nullptr;
  int64_t first_index = 0;  // ParamRecord::first_index of the first element: stochastic rounding's key
};

// Byte offset of element `index` of a `dtype` buffer.
inline char* element(void* base, int64_t index, DType dtype) {
  return static_cast<char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}
inline std::size_t span_bytes(int64_t count, DType dtype) {
  return static_cast<std::size_t>(count) * dtype_size(dtype);
}

// ZeRO-2: an open bucket of gradients being collected for a reduce to the owners.
struct GradBucket {
  int64_t begin = 0;                  // global position (layout order) of its first element
  int64_t length = 0;
  int64_t missing = 0;                // trainable elements not handed yet
  int slot = -1;                      // staging buffer in use, -1 until the first hand-over
  std::vector<std::unique_ptr<PendingCollective>> pending;  // its reduces, once issued
};

inline std::string describe(const ParamRecord& p) {
  return fmt::format("'{}' (numel {}, {}, {}, group {})", p.name, p.numel, dtype_name(p.dtype),
                     p.device.is_cpu() ? "cpu" : "cuda", p.group);
}

}  // namespace optim

struct ZeroOptimizer::Impl {
  std::shared_ptr<Communicator> comm;
  OptimizerConfig config;
  // Where every buffer (params, grads, state, staging) lives: the params' device. On a CUDA
  // device all of the optimizer's device work is enqueued on `stream`: nccl_stream(comm) for
  // NCCL, else `own_stream`. Declared before the buffers so that it outlives them.
  Device device = Device::cpu();
  void* stream = nullptr;
  device::OwnedStream own_stream;
  // CUDA-aware MPI on device buffers works on the host's timeline: the stream is synchronised
  // before each collective, and avg (which MpiCommunicator divides on the host) is done as sum
  // plus a division on the stream.
  bool host_driven_device_comm = false;
  // NCCL takes device buffers only: the host-side collectives (fingerprint, hyperparameter
  // agreement) go through this staging view of it.
  std::unique_ptr<optim::HostStagedCommunicator> host_staging;
  std::vector<Hyperparams> groups;
  Hyperparams defaults;
  std::vector<optim::ParamRecord> params;
  partition::Layout layout;
  bool has_layout = false;
  bool layout_dirty = false;
  uint64_t layout_version = 0;

  // The parameters' (and gradients') dtype, shared by all of them: fixed by the first one.
  DType dtype = DType::f32;

  std::array<core::FlatBuffer, optim::kStateKinds> state;  // f32, over this rank's shard

  // Which state kinds exist: the same on every rank, even where a shard is empty.
  std::array<bool, optim::kStateKinds> state_in_use{};
  // In `dtype`:
  core::FlatBuffer flat_params;   // bucket view: trainable shards then frozen params
  core::FlatBuffer flat_grads;    // bucket view, stage 1: same offsets as flat_params
  core::FlatBuffer sync_staging;  // external: the rank-ordered shards, for the param sync
  core::FlatBuffer grad_staging;  // external, stage 1: one bucket for reduce_gradients
  core::FlatBuffer shard_grads;   // stage 2: this rank's shard of the averaged gradients

  // Stage 2's gradient round: buckets over the layout's positions, filled by reduce_gradient()
  // (or from the caller's buffers), each reduced to its owners once complete.
  std::vector<optim::GradBucket> grad_buckets;
  std::vector<core::FlatBuffer> bucket_staging;  // a pool: at most kBucketsInFlight + open ones
  std::vector<bool> staging_busy;
  std::vector<int> buckets_in_flight;  // issued, not yet waited for, oldest first
  std::vector<bool> handed;            // per param, this round
  int64_t handed_count = 0;
  uint64_t handed_order = 0;           // a hash of the hand-over order, compared across ranks
  static constexpr std::size_t kBucketsInFlight = 2;

  // Loss scaling (GradScaler's state) and the clipping armed for the next step.
  double scale = 1.0;
  int64_t growth_tracker = 0;
  float pending_clip = 1.f;
  double pending_norm = -1.0;
  bool nonfinite_known = false;  // clip_grad_norm() already checked the gradients
  bool nonfinite = false;
  StepReport report;
  core::FlatBuffer stats_scratch;  // on a device: two doubles of gradient statistics
  std::vector<int64_t> view_offset;  // bucket view: each param's place in flat_params
  std::vector<optim::UpdateRun> runs;
  // consolidate_state_dict(to)'s result, on rank `to` only (src/checkpoint).
  std::optional<StateDict> consolidated_state;

  int rank() const { return comm->rank(); }
  int world() const { return comm->size(); }
  bool on_device() const { return device.is_cuda(); }
  Communicator& host_comm() const { return host_staging ? *host_staging : *comm; }
  bool bucket_view() const { return config.storage == Storage::bucket_view; }
  bool sharded() const { return config.shard_state && world() > 1; }
  const partition::RankShard& own_shard() const { return layout.shards[static_cast<std::size_t>(rank())]; }
  int64_t bucket_elements() const {
    return std::max<int64_t>(optim::kShardAlignment, config.bucket_bytes / static_cast<int64_t>(dtype_size(dtype)));
  }
  bool stage2() const { return config.stage == 2; }
  bool low_precision() const { return dtype != DType::f32; }

  partition::Strategy strategy() const {
    if (!config.shard_state) return partition::Strategy::replicated;
    return config.partition == PartitionStrategy::flat ? partition::Strategy::flat
                                                       : partition::Strategy::sorted_greedy;
  }

  std::vector<partition::ParamInfo> param_infos() const {
    std::vector<partition::ParamInfo> infos;
    infos.reserve(params.size());
    for (const optim::ParamRecord& p : params) infos.push_back({p.numel, p.group, p.trainable});
    return infos;
  }

  optim::ParamRecord& param(ParamId id) {
    SHARDOPT_CHECK(id >= 0 && static_cast<std::size_t>(id) < params.size(), invalid_argument,
                   "parameter id {} is out of range (0..{})", id, static_cast<int64_t>(params.size()) - 1);
    return params[static_cast<std::size_t>(id)];
  }

  // ---- devices -------------------------------------------------------------------------------

  // A device communicator (NCCL) fixes the device and the stream before anything is registered.
  void attach_device_communicator() {
    if (!comm->device().is_cuda()) return;
    try {
      stream = nccl_stream(*comm);
    } catch (const Error&) {
      raise(ErrorCode::unsupported,
            "ZeroOptimizer: the '{}' communicator works on {} but is not a nccl communicator, so "
            "the optimizer cannot order its kernels against its collectives",
            comm->backend_name(), device_name(comm->device()));
    }
    device = comm->device();
    host_staging = std::make_unique<optim::HostStagedCommunicator>(*comm, device, stream);
  }

  // The device and dtype all parameters must share, and what fixed them (for messages).
  struct DeviceChoice {
    bool fixed = false;
    Device device = Device::cpu();
    std::string source;
    bool dtype_fixed = false;
    DType dtype = DType::f32;
    std::string dtype_source;
  };
  DeviceChoice current_device_choice() const {
    DeviceChoice choice;
    if (comm->device().is_cuda()) {
      choice = {true, comm->device(), fmt::format("the {} communicator", comm->backend_name()), false, DType::f32, ""};
    } else if (!params.empty()) {
      choice = {true, device, fmt::format("parameter '{}'", params.front().name), false, DType::f32, ""};
    }
    if (!params.empty()) {
      choice.dtype_fixed = true;
      choice.dtype = dtype;
      choice.dtype_source = fmt::format("parameter '{}'", params.front().name);
    }
    return choice;
  }

  // One flat buffer per optimizer: every parameter has the first one's dtype.
  static void check_param_dtype(const std::string& label, DType d, DeviceChoice& choice) {
    SHARDOPT_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, invalid_argument,
                   "parameter {} has an unknown dtype ({})", label, static_cast<int>(d));
    if (!choice.dtype_fixed) {
      choice.dtype_fixed = true;
      choice.dtype = d;
      choice.dtype_source = "parameter " + label;
    }
    SHARDOPT_CHECK(d == choice.dtype, unsupported,
                   "parameter {} is {}, but {} is {}: all parameters of an optimizer share one dtype "
                   "(use one optimizer per dtype)",
                   label, dtype_name(d), choice.dtype_source, dtype_name(choice.dtype));
  }

  void check_param_device(const std::string& label, Device d, DeviceChoice& choice) const {
    SHARDOPT_CHECK(!d.is_cuda() || device::cuda_compiled_in(), unsupported,
                   "parameter {} is on {}, but this build has no CUDA support (configure shardopt "
                   "with SHARDOPT_WITH_CUDA=ON where the CUDA toolkit is installed)",
                   label, device_name(d));
    if (!choice.fixed) {
      const std::string unusable = device::unusable_reason(d);
      SHARDOPT_CHECK(unusable.empty(), cuda, "parameter {} is on {}, but rank {} cannot use it: {}",
                     label, device_name(d), rank(), unusable);
      choice.fixed = true;
      choice.device = d;
      choice.source = "parameter " + label;
    }
    SHARDOPT_CHECK(d == choice.device, unsupported,
                   "parameter {} is on {}, but {} is on {}: all parameters of an optimizer must "
                   "live on one device, the communicator's device for a device communicator",
                   label, device_name(d), choice.source, device_name(choice.device));
  }

  // First CUDA parameters over a host communicator: collectives would get device pointers,
  // which only a CUDA-aware MPI accepts (one rank needs no collective on them at all).
  void adopt_device(Device d) {
    if (!d.is_cuda() || on_device()) return;
    if (world() > 1) {
      std::string reason = fmt::format("the '{}' communicator is not MPI", comm->backend_name());
      const bool aware = std::string(comm->backend_name()) == "mpi" && mpi_support::mpi_cuda_aware(&reason);
      SHARDOPT_CHECK(aware, unsupported,
                     "parameters on {} over the host-memory '{}' communicator of {} ranks need a "
                     "CUDA-aware MPI, but {} (rank {}); use nccl_world() or nccl_borrow() for CUDA "
                     "parameters",
                     device_name(d), comm->backend_name(), world(), reason, rank());
    }
    own_stream = device::OwnedStream(d);
    stream = own_stream.get();
    device = d;
    host_driven_device_comm = world() > 1;
  }

  core::FlatBuffer new_buffer(int64_t numel, DType element_type = DType::f32) const {
    core::FlatBuffer buffer(device, stream, element_type);
    buffer.resize(numel);
    return buffer;
  }

  // The copies and fills of the step pipeline: memcpy/memset on the host; on a device, enqueued
  // on the stream (device to device, or from the caller's initial values wherever they live).
  void copy_bytes(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;  // empty shards have null buffers
    if (on_device()) {
      device::cuda_copy(dst, src, bytes, stream, device);
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  void zero_bytes(void* dst, std::size_t bytes) const {
    if (bytes == 0) return;
    if (on_device()) {
      device::cuda_zero(dst, bytes, stream, device);
    } else {
      std::memset(dst, 0, bytes);
    }
  }

  // Before a collective on device buffers: NCCL runs on the stream itself, in order; CUDA-aware
  // MPI reads the buffers from the host's timeline, so the stream's work must be done.
  void settle_before_collective() const {
    if (host_driven_device_comm) device::cuda_synchronize(stream, device, "before an MPI collective on device buffers");
  }
  ReduceOp gradient_average_op() const { return host_driven_device_comm ? ReduceOp::sum : ReduceOp::avg; }
  void finish_gradient_average(void* data, int64_t count) const {
    if (host_driven_device_comm && count > 0) optim::divide_device(data, dtype, count, static_cast<float>(world()), stream);
  }

  // ---- registration ---------------------------------------------------------------------

  // Checks one group locally and turns its specs into records (not yet added).
  std::vector<optim::ParamRecord> records_for(const ParamGroupSpec& spec, int32_t group_index,
                                              DeviceChoice& choice) const {
    optim::validate_hyperparams(spec.hyper.resolve(defaults), config.algorithm, group_index);
    SHARDOPT_CHECK(!spec.params.empty(), invalid_argument,
                   "param group {} has an empty parameter list", group_index);
    std::vector<optim::ParamRecord> records;
    for (const ParamSpec& p : spec.params) {
      const std::string label = p.name.empty() ? fmt::format("#{}", params.size() + records.size()) : "'" + p.name + "'";
      SHARDOPT_CHECK(!p.name.empty(), invalid_argument, "parameter {} in group {} has no name", label, group_index);
      SHARDOPT_CHECK(p.param.numel >= 0, invalid_argument, "parameter {} has negative numel {}", label, p.param.numel);
      check_param_device(label, p.param.device, choice);
      check_param_dtype(label, p.param.dtype, choice);
      if (bucket_view()) {
        SHARDOPT_CHECK(p.grad.data == nullptr, invalid_argument,
                       "parameter {}: in bucket_view storage shardopt owns the gradient; leave grad.data null and write into grad_view()",
                       label);
      } else {
        SHARDOPT_CHECK(p.param.data != nullptr || p.param.numel == 0, invalid_argument,
                       "parameter {}: external storage needs the parameter buffer (param.data is null)", label);
        SHARDOPT_CHECK(p.grad.data != nullptr || p.param.numel == 0, invalid_argument,
                       "parameter {}: external storage needs a gradient buffer (grad.data is null)", label);
        SHARDOPT_CHECK(p.grad.numel == p.param.numel && p.grad.dtype == p.param.dtype &&
                           p.grad.device == p.param.device,
                       invalid_argument,
                       "parameter {}: gradient ({} elements, {}, {}) does not match the parameter ({} elements, {}, {})",
                       label, p.grad.numel, dtype_name(p.grad.dtype), device_name(p.grad.device),
                       p.param.numel, dtype_name(p.param.dtype), device_name(p.param.device));
        if (p.param.device.is_cuda() && p.param.numel > 0) {
          device::check_cuda_pointer(p.param.device, p.param.data, fmt::format("parameter {}: param.data", label));
          device::check_cuda_pointer(p.param.device, p.grad.data, fmt::format("parameter {}: grad.data", label));
        }
      }
      for (const optim::ParamRecord& existing : params) {
        SHARDOPT_CHECK(existing.name != p.name, invalid_argument, "parameter name '{}' is registered twice", p.name);
      }
      for (const optim::ParamRecord& earlier : records) {
        SHARDOPT_CHECK(earlier.name != p.name, invalid_argument, "parameter name '{}' is registered twice", p.name);
      }
      optim::ParamRecord r;
      r.name = p.name;
      r.numel = p.param.numel;
      r.dtype = p.param.dtype;
      r.device = p.param.device;
      r.group = group_index;
      r.user_param = p.param.data;
      r.user_grad = p.grad.data;
      records.push_back(std::move(r));
    }
    return records;
  }

  // Collective: validates `specs` locally, agrees with the other ranks, then appends them.
  void register_groups(const std::vector<ParamGroupSpec>& specs, const char* what) {
    std::vector<optim::ParamRecord> added;
    std::string local_error;
    ErrorCode local_code = ErrorCode::invalid_argument;
    try {
      SHARDOPT_CHECK(!specs.empty(), invalid_argument, "{}: the parameter list is empty", what);
      DeviceChoice choice = current_device_choice();
      for (std::size_t g = 0; g < specs.size(); ++g) {
        std::vector<optim::ParamRecord> records = records_for(specs[g], static_cast<int32_t>(groups.size() + g), choice);
        for (optim::ParamRecord& r : records) added.push_back(std::move(r));
      }
      adopt_device(choice.device);
      if (choice.dtype_fixed) dtype = choice.dtype;
    } catch (const Error& e) {
      local_error = e.what();
      local_code = e.code();
      added.clear();
    }
    std::vector<optim::ParamSignature> signatures;
    for (const optim::ParamRecord& r : added) signatures.push_back({optim::describe(r)});
    optim::check_same_registration(host_comm(), signatures, what, local_error, local_code);

    const std::size_t first_new = params.size();
    for (const ParamGroupSpec& spec : specs) groups.push_back(spec.hyper.resolve(defaults));
    int64_t next_index = params.empty() ? 0 : params.back().first_index + params.back().numel;
    for (optim::ParamRecord& r : added) {
      r.first_index = next_index;
      next_index += r.numel;
      params.push_back(std::move(r));
    }
    rebuild_layout(&specs, first_new);
  }

  // ---- layout and state -------------------------------------------------------------------

  std::array<bool, optim::kStateKinds> state_kinds_needed() const {
    std::array<bool, optim::kStateKinds> needed = optim::state_kinds_needed(config.algorithm, dtype, groups);
    // State once created is kept, as torch keeps it when momentum or amsgrad is switched off.
    for (std::size_t k = 0; k < optim::kStateKinds; ++k) needed[k] = needed[k] || state_in_use[k];
    return needed;
  }

  // Allocates state kinds that hyperparameter changes made necessary (zeros, as torch's
  // lazily created state).
  void ensure_state_kinds() {
    const auto needed = state_kinds_needed();
    for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
      if (needed[k] && state[k].numel() != own_shard().numel) state[k].resize(own_shard().numel);
    }
    state_in_use = needed;
  }

  // Moves each state element from its owner in `from` to its owner in `to`. Collective when
  // sharded: every old shard is broadcast once per state kind.
  void migrate_state(const partition::Layout& from, const partition::Layout& to,
                     std::array<core::FlatBuffer, optim::kStateKinds>& next) {
    // This rank's new pieces, by param.
    std::vector<std::vector<const partition::Segment*>> mine(params.size());
    for (const partition::Segment& s : to.shards[static_cast<std::size_t>(rank())].segments) {
      mine[static_cast<std::size_t>(s.param)].push_back(&s);
    }
    const bool replicated = from.strategy == partition::Strategy::replicated;
    const int sources = replicated ? 1 : world();
    // One receive buffer for every broadcast (on a device, each allocation would cost a cudaFree).
    core::FlatBuffer incoming(device, stream);
    int64_t largest = 0;
    for (const partition::RankShard& shard : from.shards) largest = std::max(largest, shard.numel);
    for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
      // Decided alike on every rank: a rank whose shard is empty still joins the broadcasts.
      if (!state_in_use[k]) continue;
      for (int r = 0; r < sources; ++r) {
        const partition::RankShard& old_shard = from.shards[static_cast<std::size_t>(replicated ? rank() : r)];
        const float* source = state[k].data();
        if (!replicated && world() > 1) {
          if (incoming.empty()) incoming.resize(largest);
          if (r == rank()) copy_bytes(incoming.data(), state[k].data(), static_cast<std::size_t>(old_shard.numel) * sizeof(float));
          settle_before_collective();
          comm->broadcast(incoming.data(), old_shard.numel, DType::f32, r);
          source = incoming.data();
        }
        for (const partition::Segment& old_seg : old_shard.segments) {
          for (const partition::Segment* new_seg : mine[static_cast<std::size_t>(old_seg.param)]) {
            const int64_t lo = std::max(old_seg.param_offset, new_seg->param_offset);
            const int64_t hi = std::min(old_seg.param_offset + old_seg.length, new_seg->param_offset + new_seg->length);
            if (lo >= hi) continue;
            copy_bytes(next[k].data() + new_seg->shard_offset + (lo - new_seg->param_offset),
                       source + old_seg.shard_offset + (lo - old_seg.param_offset),
                       static_cast<std::size_t>(hi - lo) * sizeof(float));
          }
        }
      }
    }
  }

  // Builds the layout for the current params and trainable flags, carrying state and (bucket
  // view) values across. `initial`/`first_new`: specs whose initial values seed new params.
  void rebuild_layout(const std::vector<ParamGroupSpec>* initial = nullptr, std::size_t first_new = 0) {
    const device::ScopedDevice scope(device);
    SHARDOPT_CHECK(!stage2() || handed_count == 0, invalid_argument,
                   "the layout cannot change while a stage-2 gradient round is open (call "
                   "reduce_gradients() first)");
    finish_buckets_in_flight();
    partition::Layout next = partition::make_layout(strategy(), param_infos(), world(), optim::kShardAlignment);
    const int64_t next_shard = next.shards[static_cast<std::size_t>(rank())].numel;

    // Every kind gets the device, even when empty: ensure_state_kinds() may allocate it later.
    std::array<core::FlatBuffer, optim::kStateKinds> next_state;
    const auto needed = state_kinds_needed();
    for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
      next_state[k] = new_buffer(needed[k] ? next_shard : 0);
    }
    if (has_layout) migrate_state(layout, next, next_state);
    state_in_use = needed;

    if (bucket_view()) {
      std::vector<int64_t> next_offset(params.size());
      int64_t tail = next.buffer_numel;
      for (std::size_t i = 0; i < params.size(); ++i) {
        next_offset[i] = params[i].trainable ? next.param_offset[i] : tail;
        if (!params[i].trainable) tail += params[i].numel;
      }
      core::FlatBuffer next_params = new_buffer(tail, dtype);
      // Stage 2 keeps no whole-model gradient buffer: gradients arrive through reduce_gradient().
      core::FlatBuffer next_grads = new_buffer(stage2() ? 0 : tail, dtype);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const std::size_t bytes = optim::span_bytes(params[i].numel, dtype);
        if (bytes == 0) continue;
        if (i < view_offset.size()) {
          copy_bytes(next_params.at(next_offset[i]), flat_params.at(view_offset[i]), bytes);
          if (!stage2()) copy_bytes(next_grads.at(next_offset[i]), flat_grads.at(view_offset[i]), bytes);
        } else if (initial != nullptr) {
          const void* source = initial_value(*initial, i - first_new);
          if (source != nullptr) copy_bytes(next_params.at(next_offset[i]), source, bytes);
        }
      }
      // The caller may reuse its initial-value buffers as soon as registration returns.
      if (initial != nullptr && on_device()) device::cuda_synchronize(stream, device, "initial parameter values");
      flat_params = std::move(next_params);
      flat_grads = std::move(next_grads);
      view_offset = std::move(next_offset);
    } else {
      sync_staging = new_buffer(sharded() ? next.buffer_numel : 0, dtype);
      const int64_t trainable = next.trainable_numel;
      grad_staging = new_buffer(world() > 1 && !stage2() ? std::min(trainable, bucket_elements()) : 0, dtype);
    }
    shard_grads = new_buffer(stage2() ? next_shard : 0, dtype);
    bucket_staging.clear();
    staging_busy.clear();
    grad_buckets.clear();
    handed.assign(params.size(), false);
    state = std::move(next_state);
    layout = std::move(next);
    has_layout = true;
    layout_dirty = false;
    ++layout_version;
    build_runs();
    init_masters();
  }

  static const void* initial_value(const std::vector<ParamGroupSpec>& specs, std::size_t index) {
    for (const ParamGroupSpec& g : specs) {
      if (index < g.params.size()) return g.params[index].param.data;
      index -= g.params.size();
    }
    return nullptr;
  }

  // Where param i's values and gradient live (in `dtype`); null gradient in stage-2 bucket view.
  void* param_ptr(std::size_t i) const {
    return bucket_view() ? static_cast<void*>(flat_params.at(view_offset[i])) : params[i].user_param;
  }
  void* grad_ptr(std::size_t i) const {
    if (!bucket_view()) return params[i].user_grad;
    return stage2() ? nullptr : static_cast<void*>(flat_grads.at(view_offset[i]));
  }
  // Host parameter values as f32, for checkpoints: elements [offset, offset+n) of param i,
  // widened into `scratch` for bf16/f16 (exact both ways).
  const float* param_values_f32(std::size_t i, int64_t offset, int64_t n, std::vector<float>& scratch) const {
    const char* at = optim::element(param_ptr(i), offset, dtype);
    if (!low_precision()) return reinterpret_cast<const float*>(at);
    scratch.resize(static_cast<std::size_t>(n));
    kernels::widen_cpu(at, dtype, scratch.data(), n, config.cpu_threads);
    return scratch.data();
  }
  void set_param_values_f32(std::size_t i, int64_t offset, int64_t n, const float* values) {
    char* at = optim::element(param_ptr(i), offset, dtype);
    if (low_precision()) kernels::narrow_cpu(values, at, dtype, n, config.cpu_threads);
    else std::memcpy(at, values, optim::span_bytes(n, dtype));
  }

  void build_runs() {
    runs.clear();
    const partition::RankShard& shard = own_shard();
    for (const partition::Segment& s : shard.segments) {
      if (s.length == 0) continue;
      const optim::ParamRecord& p = params[static_cast<std::size_t>(s.param)];
      char* param_at = optim::element(param_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dtype);
      char* grad_at = stage2() ? shard_grads.at(s.shard_offset)
                               : optim::element(grad_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dtype);
      const int64_t index = p.first_index + s.param_offset;
      if (!runs.empty()) {
        optim::UpdateRun& last = runs.back();
        const optim::ParamRecord& q = params[static_cast<std::size_t>(last.first_param)];
        const std::size_t run_bytes = optim::span_bytes(last.length, dtype);
        const bool contiguous = last.shard_offset + last.length == s.shard_offset &&
                                last.param + run_bytes == param_at && last.grad + run_bytes == grad_at &&
                                last.first_index + last.length == index;
        if (contiguous && q.group == p.group && q.step == p.step && q.has_momentum_buffer == p.has_momentum_buffer) {
          last.length += s.length;
          continue;
        }
      }
      runs.push_back(optim::UpdateRun{s.param, s.shard_offset, s.length, param_at, grad_at, index});
    }
  }

  // bf16/f16: the master copy of params that have not stepped yet (new, or thawed) starts as
  // their current value; params that have keep the master carried over by migrate_state.
  void init_masters() {
    if (!low_precision()) return;
    float* master = state[optim::kMaster].data();
    for (const optim::UpdateRun& run : runs) {
      if (params[static_cast<std::size_t>(run.first_param)].step != 0) continue;
      if (on_device()) {
        optim::widen_device(run.param, dtype, master + run.shard_offset, run.length, stream);
      } else {
        kernels::widen_cpu(run.param, dtype, master + run.shard_offset, run.length, config.cpu_threads);
      }
    }
  }

  // ---- the step ---------------------------------------------------------------------------

  // Every rank validates its hyperparameters; one tiny all-reduce makes all ranks fail
  // together when any rank's are invalid, instead of leaving the others in the sync. The same
  // all-reduce carries loss scaling's inf/NaN flag: whether any rank's gradients hold one.
  bool agree_on_hyperparams(bool local_nonfinite) {
    std::string local_error;
    for (std::size_t g = 0; g < groups.size() && local_error.empty(); ++g) {
      try {
        optim::validate_hyperparams(groups[g], config.algorithm, static_cast<int>(g));
      } catch (const Error& e) {
        local_error = e.what();
      }
    }
    float votes[2] = {local_error.empty() ? 0.f : static_cast<float>(rank() + 1), local_nonfinite ? 1.f : 0.f};
    if (world() > 1) host_comm().all_reduce(votes, 2, DType::f32, ReduceOp::max);
    if (!local_error.empty()) throw Error(ErrorCode::invalid_argument, local_error);
    SHARDOPT_CHECK(votes[0] == 0.f, invalid_argument,
                   "step refused: rank {} has invalid hyperparameters (its error names them)",
                   static_cast<int>(votes[0]) - 1);
    return votes[1] != 0.f;
  }

  // What the update multiplies each gradient by first: 1/scale in float, as GradScaler's
  // inv_scale = scale.double().reciprocal().float().
  float unscale_factor() const {
    return config.loss_scaling.enabled ? static_cast<float>(1.0 / scale) : 1.f;
  }

  // This rank's share of the gradient statistics: over its shard's (averaged) gradients.
  kernels::GradStats local_grad_stats(bool inf_norm) {
    kernels::GradStats total;
    if (on_device()) {
      if (stats_scratch.empty()) stats_scratch = new_buffer(4);  // two doubles, kept across steps
      bool first = true;
      for (const optim::UpdateRun& run : runs) {
        optim::grad_stats_device(run.grad, dtype, run.length, unscale_factor(), inf_norm,
                                 reinterpret_cast<double*>(stats_scratch.data()), !first, nullptr, stream);
        first = false;
      }
      if (first) return total;
      double host[2] = {0.0, 0.0};
      device::cuda_copy(host, stats_scratch.data(), sizeof(host), stream, device);
      device::cuda_synchronize(stream, device, "gradient statistics");
      total.value = host[0];
      total.nonfinite = host[1] != 0.0;
      return total;
    }
    for (const optim::UpdateRun& run : runs) {
      const kernels::GradStats part =
          kernels::grad_stats_cpu(run.grad, dtype, run.length, unscale_factor(), inf_norm, config.cpu_threads);
      total.value = inf_norm ? std::max(total.value, part.value) : total.value + part.value;
      total.nonfinite = total.nonfinite || part.nonfinite;
    }
    return total;
  }

  // Collective: the total norm over every rank's shard. Each rank's partial (a double) is
  // all-gathered and combined in rank order, so every rank computes the same bits.
  double clip_grad_norm(double max_norm, double norm_type) {
    const device::ScopedDevice scope(device);
    SHARDOPT_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, invalid_argument,
                   "clip_grad_norm: max_norm must be a finite number >= 0, got {}", max_norm);
    const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
    SHARDOPT_CHECK(inf_norm || norm_type == 2.0, invalid_argument,
                   "clip_grad_norm: norm_type {} is not supported (2 or inf)", norm_type);
    if (layout_dirty) rebuild_layout();
    finish_open_round_check("clip_grad_norm");
    const kernels::GradStats mine = local_grad_stats(inf_norm);
    // {value, nonfinite} per rank, moved as raw float-sized words.
    // Replicated state: every rank's runs cover every gradient, so its own value is the total.
    const int parts = sharded() ? world() : 1;
    double record[2] = {mine.value, mine.nonfinite ? 1.0 : 0.0};
    std::vector<double> all(static_cast<std::size_t>(2 * parts));
    if (parts > 1) {
      host_comm().all_gather(record, all.data(), 4, DType::f32);
    } else {
      all.assign(record, record + 2);
    }
    double combined = 0.0;
    bool any_nonfinite = false;
    for (int r = 0; r < parts; ++r) {
      const double v = all[static_cast<std::size_t>(2 * r)];
      combined = inf_norm ? std::max(combined, v) : combined + v;
      any_nonfinite = any_nonfinite || all[static_cast<std::size_t>(2 * r + 1)] != 0.0;
    }
    // torch returns the norm as a float32 tensor and derives the factor in float32:
    // max_norm * reciprocal(norm + 1e-6), clamped at 1.
    float norm = static_cast<float>(inf_norm ? combined : std::sqrt(combined));
    if (any_nonfinite) norm = std::numeric_limits<float>::quiet_NaN();
    const float coef = (1.f / (norm + 1e-6f)) * static_cast<float>(max_norm);
    pending_clip = coef < 1.f ? coef : (std::isnan(coef) ? coef : 1.f);
    pending_norm = norm;
    nonfinite_known = true;
    nonfinite = any_nonfinite;
    return norm;
  }

  // Updates the elements of this rank's shard in [lo, hi) (shard offsets).
  void update_range(int64_t lo, int64_t hi) {
    const int threads = config.cpu_threads;
    const kernels::GradTransform transform{unscale_factor(), pending_clip};
    for (const optim::UpdateRun& whole : runs) {
      const int64_t begin = std::max(lo, whole.shard_offset);
      const int64_t end = std::min(hi, whole.shard_offset + whole.length);
      if (begin >= end) continue;
      const int64_t skip = begin - whole.shard_offset;
      optim::UpdateRun run = whole;
      run.shard_offset = begin;
      run.length = end - begin;
      run.param += optim::span_bytes(skip, dtype);
      run.grad += optim::span_bytes(skip, dtype);
      run.first_index += skip;
      const optim::ParamRecord& p = params[static_cast<std::size_t>(run.first_param)];
      const Hyperparams& h = groups[static_cast<std::size_t>(p.group)];
      auto at = [&](std::size_t kind) {
        return state[kind].empty() ? nullptr : state[kind].data() + run.shard_offset;
      };
      kernels::UpdateTensors tensors;
      tensors.param = run.param;
      tensors.grad = run.grad;
      tensors.master = low_precision() ? at(optim::kMaster) : nullptr;
      tensors.dtype = dtype;
      kernels::Rounding rounding;
      rounding.stochastic = config.stochastic_rounding;
      rounding.seed = config.rounding_seed;
      rounding.step = static_cast<uint64_t>(p.step + 1);
      rounding.first_index = static_cast<uint64_t>(run.first_index);
      if (config.algorithm == Algorithm::sgd) {
        const kernels::SgdScalars s = kernels::make_sgd_scalars(
            h.lr, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.maximize, !p.has_momentum_buffer);
        if (on_device()) {
          optim::sgd_update_device(tensors, at(optim::kMomentum), run.length, s, transform, rounding, stream);
        } else {
          kernels::sgd_update_cpu(tensors, at(optim::kMomentum), run.length, s, transform, rounding, threads);
        }
      } else {
        const kernels::AdamScalars s = kernels::make_adam_scalars(
            h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, config.algorithm == Algorithm::adamw,
            h.amsgrad, h.maximize, p.step + 1);
        if (on_device()) {
          optim::adam_update_device(tensors, at(optim::kExpAvg), at(optim::kExpAvgSq), at(optim::kMaxExpAvgSq),
                                    run.length, s, transform, rounding, stream);
        } else {
          kernels::adam_update_cpu(tensors, at(optim::kExpAvg), at(optim::kExpAvgSq), at(optim::kMaxExpAvgSq),
                                   run.length, s, transform, rounding, threads);
        }
      }
    }
  }

  void advance_steps() {
    // Every rank advances every trainable param, so step counts agree without communication.
    for (optim::ParamRecord& p : params) {
      if (!p.trainable) continue;
      ++p.step;
      // torch keeps a momentum buffer through steps taken with momentum 0 and resumes it.
      if (config.algorithm == Algorithm::sgd && groups[static_cast<std::size_t>(p.group)].momentum != 0.0) {
        p.has_momentum_buffer = true;
      }
    }
  }

  // Copies pieces between the caller's param buffers and the rank-ordered staging buffer.
  void copy_segments(const partition::RankShard& shard, bool to_staging) {
    for (const partition::Segment& s : shard.segments) {
      char* user = optim::element(params[static_cast<std::size_t>(s.param)].user_param, s.param_offset, dtype);
      char* staged = sync_staging.at(shard.offset + s.shard_offset);
      const std::size_t bytes = optim::span_bytes(s.length, dtype);
      if (bytes == 0) continue;
      if (to_staging) copy_bytes(staged, user, bytes);
      else copy_bytes(user, staged, bytes);
    }
  }

  // Every rank's shard of `buffer` (laid out as layout.shards, in `dtype`) reaches every rank.
  void exchange_shards(void* buffer) {
    settle_before_collective();
    if (layout.strategy == partition::Strategy::flat) {
      const int64_t count = own_shard().numel;
      if (count > 0) comm->all_gather(optim::element(buffer, own_shard().offset, dtype), buffer, count, dtype);
      return;
    }
    // sorted_greedy: shards differ in size; one broadcast per rank, cut into buckets, all in
    // flight together.
    std::vector<std::unique_ptr<PendingCollective>> pending;
    for (int r = 0; r < world(); ++r) {
      const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      for (int64_t begin = 0; begin < shard.numel; begin += bucket_elements()) {
        const int64_t count = std::min(bucket_elements(), shard.numel - begin);
        pending.push_back(comm->broadcast_async(optim::element(buffer, shard.offset + begin, dtype), count, dtype, r));
      }
    }
    for (auto& p : pending) p->wait();
  }

  void sync_params() {
    if (!sharded()) return;
    if (bucket_view()) {
      exchange_shards(flat_params.raw());
      return;
    }
    copy_segments(own_shard(), /*to_staging=*/true);
    exchange_shards(sync_staging.raw());
    for (int r = 0; r < world(); ++r) {
      if (r != rank()) copy_segments(layout.shards[static_cast<std::size_t>(r)], /*to_staging=*/false);
    }
  }

  // The update of this rank's shard and the parameter sync. Pipelined (bucket view, sharded,
  // config.pipeline_chunk_bytes > 0): the shards are cut into chunks; each rank updates its
  // chunk k, then all ranks start chunk k's broadcasts from their owners, which run while chunk
  // k+1 is updated. Every rank walks the same (chunk, owner) order, as collectives require.
  void update_and_sync() {
    const int64_t chunk = config.pipeline_chunk_bytes / static_cast<int64_t>(dtype_size(dtype)) /
                          optim::kShardAlignment * optim::kShardAlignment;
    if (chunk <= 0 || !sharded() || !bucket_view()) {
      update_range(0, own_shard().numel);
      advance_steps();
      sync_params();
      return;
    }
    int64_t largest = 0;
    for (const partition::RankShard& shard : layout.shards) largest = std::max(largest, shard.numel);
    constexpr std::size_t kChunksInFlight = 2;
    std::vector<std::vector<std::unique_ptr<PendingCollective>>> in_flight;
    for (int64_t begin = 0; begin < largest; begin += chunk) {
      update_range(begin, begin + chunk);  // nothing past this rank's shard
      settle_before_collective();
      std::vector<std::unique_ptr<PendingCollective>> round;
      for (int r = 0; r < world(); ++r) {
        const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
        if (begin >= shard.numel) continue;
        const int64_t count = std::min(chunk, shard.numel - begin);
        round.push_back(comm->broadcast_async(flat_params.at(shard.offset + begin), count, dtype, r));
      }
      in_flight.push_back(std::move(round));
      if (in_flight.size() > kChunksInFlight) {
        for (auto& p : in_flight.front()) p->wait();
        in_flight.erase(in_flight.begin());
      }
    }
    for (auto& round : in_flight) {
      for (auto& p : round) p->wait();
    }
    advance_steps();
  }

  void step() {
    const device::ScopedDevice scope(device);
    if (layout_dirty) rebuild_layout();
    finish_open_round_check("step");
    // Loss scaling needs to know, on every rank alike, whether any gradient is inf or NaN.
    bool local_nonfinite = false;
    const bool scaling = config.loss_scaling.enabled;
    if (scaling && !nonfinite_known) local_nonfinite = local_grad_stats(/*inf_norm=*/true).nonfinite;
    if (nonfinite_known) local_nonfinite = nonfinite;  // already agreed by clip_grad_norm()
    const bool found_nonfinite = agree_on_hyperparams(local_nonfinite);

    report.loss_scale = scaling ? scale : 1.0;
    report.grad_norm = pending_norm;
    report.clip_coef = pending_clip;
    report.skipped = scaling && found_nonfinite;
    if (report.skipped) {
      // GradScaler.update(): back off and restart the growth count; nothing else changes.
      scale = std::max(scale * config.loss_scaling.backoff_factor, config.loss_scaling.min_scale);
      growth_tracker = 0;
      ++report.skipped_steps;
    } else {
      ensure_state_kinds();
      update_and_sync();
      if (scaling && ++growth_tracker == config.loss_scaling.growth_interval) {
        scale *= config.loss_scaling.growth_factor;
        growth_tracker = 0;
      }
    }
    pending_clip = 1.f;
    pending_norm = -1.0;
    nonfinite_known = false;
    nonfinite = false;
  }

  void reduce_gradients() {
    const device::ScopedDevice scope(device);
    if (layout_dirty) rebuild_layout();
    if (stage2()) {
      reduce_gradients_to_owners();
      return;
    }
    if (world() == 1) return;
    if (bucket_view()) {
      settle_before_collective();
      // Two buckets in flight: the next one starts while the last finishes, and MPI's
      // temporary buffers stay at two buckets instead of a whole gradient's worth.
      std::unique_ptr<PendingCollective> in_flight[2];
      const int64_t total = layout.buffer_numel;
      int64_t index = 0;
      for (int64_t begin = 0; begin < total; begin += bucket_elements(), ++index) {
        const int64_t count = std::min(bucket_elements(), total - begin);
        auto& slot = in_flight[index % 2];
        if (slot) slot->wait();
        slot = comm->all_reduce_async(flat_grads.at(begin), count, dtype, gradient_average_op());
      }
      for (auto& slot : in_flight) {
        if (slot) slot->wait();
      }
      finish_gradient_average(flat_grads.raw(), total);
      return;
    }
    // External: pack trainable grads into one staging bucket at a time, average, unpack.
    struct Piece { char* grad; int64_t offset; int64_t length; };
    std::vector<Piece> pieces;
    int64_t filled = 0;
    auto flush = [&] {
      if (filled == 0) return;
      settle_before_collective();
      comm->all_reduce(grad_staging.raw(), filled, dtype, gradient_average_op());
      finish_gradient_average(grad_staging.raw(), filled);
      for (const Piece& piece : pieces) {
        copy_bytes(piece.grad, grad_staging.at(piece.offset), optim::span_bytes(piece.length, dtype));
      }
      pieces.clear();
      filled = 0;
    };
    for (const optim::ParamRecord& p : params) {
      if (!p.trainable) continue;
      for (int64_t done = 0; done < p.numel;) {
        const int64_t length = std::min(p.numel - done, grad_staging.numel() - filled);
        char* source = optim::element(p.user_grad, done, dtype);
        copy_bytes(grad_staging.at(filled), source, optim::span_bytes(length, dtype));
        pieces.push_back(Piece{source, filled, length});
        filled += length;
        done += length;
        if (filled == grad_staging.numel()) flush();
      }
    }
    flush();
  }

  // ---- stage 2: gradients reduced to their owners ----------------------------------------
  //
  // The layout's positions [0, buffer_numel) are cut into buckets of bucket_elements(). Each
  // rank's shard is a contiguous range of positions, so a bucket meets each rank's shard in at
  // most one contiguous piece: reducing the bucket is one rooted reduce per owner, straight
  // into that owner's shard_grads. Together they move what one reduce-scatter would.

  void open_round_if_needed() {
    if (!grad_buckets.empty()) return;
    const int64_t total = layout.buffer_numel;
    for (int64_t begin = 0; begin < total; begin += bucket_elements()) {
      optim::GradBucket bucket;
      bucket.begin = begin;
      bucket.length = std::min(bucket_elements(), total - begin);
      grad_buckets.push_back(std::move(bucket));
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) continue;
      const int64_t lo = layout.param_offset[i];
      const int64_t hi = lo + params[i].numel;
      for (int64_t pos = lo; pos < hi;) {
        optim::GradBucket& b = grad_buckets[static_cast<std::size_t>(pos / bucket_elements())];
        const int64_t end = std::min(hi, b.begin + b.length);
        b.missing += end - pos;
        pos = end;
      }
    }
  }

  int acquire_staging() {
    for (std::size_t i = 0; i < staging_busy.size(); ++i) {
      if (!staging_busy[i]) {
        staging_busy[i] = true;
        return static_cast<int>(i);
      }
    }
    // A model smaller than one bucket needs no more staging than itself.
    bucket_staging.push_back(new_buffer(std::min(bucket_elements(), layout.buffer_numel), dtype));
    staging_busy.push_back(true);
    return static_cast<int>(bucket_staging.size()) - 1;
  }

  void wait_bucket(int index) {
    optim::GradBucket& b = grad_buckets[static_cast<std::size_t>(index)];
    for (auto& p : b.pending) p->wait();
    b.pending.clear();
    if (b.slot >= 0) staging_busy[static_cast<std::size_t>(b.slot)] = false;
    b.slot = -1;
  }

  void finish_buckets_in_flight() {
    for (int index : buckets_in_flight) wait_bucket(index);
    buckets_in_flight.clear();
  }

  // All of a bucket's gradients are in: reduce each owner's piece to it.
  void issue_bucket(int index) {
    optim::GradBucket& b = grad_buckets[static_cast<std::size_t>(index)];
    if (buckets_in_flight.size() >= kBucketsInFlight) {
      wait_bucket(buckets_in_flight.front());
      buckets_in_flight.erase(buckets_in_flight.begin());
    }
    settle_before_collective();
    const core::FlatBuffer& staged = bucket_staging[static_cast<std::size_t>(b.slot)];
    for (int r = 0; r < world(); ++r) {
      const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      const int64_t lo = std::max(b.begin, shard.offset);
      const int64_t hi = std::min(b.begin + b.length, shard.offset + shard.numel);
      if (lo >= hi) continue;
      void* into = r == rank() ? static_cast<void*>(shard_grads.at(lo - shard.offset)) : nullptr;
      if (world() == 1) {
        copy_bytes(into, staged.at(lo - b.begin), optim::span_bytes(hi - lo, dtype));
        continue;
      }
      b.pending.push_back(comm->reduce_async(staged.at(lo - b.begin), into, hi - lo, dtype, gradient_average_op(), r));
    }
    buckets_in_flight.push_back(index);
  }

  // Copies `grad` (param i's local gradient, in `dtype`) into its buckets, issuing each bucket
  // it completes.
  void hand_gradient(std::size_t i, const void* grad) {
    open_round_if_needed();
    const optim::ParamRecord& p = params[i];
    const int64_t lo = layout.param_offset[i];
    for (int64_t pos = lo; pos < lo + p.numel;) {
      const int index = static_cast<int>(pos / bucket_elements());
      optim::GradBucket& b = grad_buckets[static_cast<std::size_t>(index)];
      const int64_t end = std::min(lo + p.numel, b.begin + b.length);
      if (b.slot < 0) b.slot = acquire_staging();
      copy_bytes(bucket_staging[static_cast<std::size_t>(b.slot)].at(pos - b.begin),
                 optim::element(const_cast<void*>(grad), pos - lo, dtype), optim::span_bytes(end - pos, dtype));
      b.missing -= end - pos;
      pos = end;
      if (b.missing == 0) issue_bucket(index);
    }
    handed[i] = true;
    ++handed_count;
    handed_order = (handed_order ^ (static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
  }

  void reduce_gradient(ParamId id, const TensorRef& grad) {
    const device::ScopedDevice scope(device);
    SHARDOPT_CHECK(stage2(), invalid_argument,
                   "reduce_gradient() is for stage 2; at stage 1 write gradients into grad_view() and "
                   "call reduce_gradients()");
    SHARDOPT_CHECK(bucket_view(), invalid_argument,
                   "reduce_gradient(): with external storage, reduce_gradients() reads the registered "
                   "gradient buffers itself");
    if (layout_dirty) rebuild_layout();
    const optim::ParamRecord& p = param(id);
    SHARDOPT_CHECK(p.trainable, invalid_argument, "reduce_gradient(): parameter '{}' is frozen", p.name);
    SHARDOPT_CHECK(grad.numel == p.numel && grad.dtype == p.dtype && grad.device == p.device, invalid_argument,
                   "reduce_gradient(): the gradient of '{}' has {} elements ({}, {}); the parameter has {} ({}, {})",
                   p.name, grad.numel, dtype_name(grad.dtype), device_name(grad.device), p.numel,
                   dtype_name(p.dtype), device_name(p.device));
    SHARDOPT_CHECK(grad.data != nullptr || p.numel == 0, invalid_argument,
                   "reduce_gradient(): the gradient of '{}' has no data", p.name);
    SHARDOPT_CHECK(!handed[static_cast<std::size_t>(id)], invalid_argument,
                   "reduce_gradient(): the gradient of '{}' was already handed in this round (call "
                   "reduce_gradients() to finish a round before the next)",
                   p.name);
    hand_gradient(static_cast<std::size_t>(id), grad.data);
    // The caller may reuse its buffer once this returns.
    if (on_device()) device::cuda_synchronize(stream, device, "reduce_gradient");
  }

  // Stage 2's reduce_gradients(): external storage hands every registered gradient; then every
  // bucket must be complete, and the round is finished.
  void reduce_gradients_to_owners() {
    if (!bucket_view()) {
      SHARDOPT_CHECK(handed_count == 0, internal, "stage-2 round already open with external storage");
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (params[i].trainable) hand_gradient(i, params[i].user_grad);
      }
    }
    open_round_if_needed();
    for (std::size_t i = 0; i < params.size(); ++i) {
      SHARDOPT_CHECK(!params[i].trainable || handed[i], invalid_argument,
                     "reduce_gradients(): rank {} never handed the gradient of '{}' with reduce_gradient() "
                     "in this round (every trainable parameter must be handed, on every rank, in the same order)",
                     rank(), params[i].name);
    }
    finish_buckets_in_flight();
    finish_gradient_average(shard_grads.raw(), shard_grads.numel());
    grad_buckets.clear();
    handed.assign(params.size(), false);
    handed_count = 0;
    const uint64_t order = handed_order;
    handed_order = 0;
    // Buckets handed in another order on some rank were matched with the wrong collectives:
    // refuse the round on every rank rather than step on mixed-up gradients.
    if (world() > 1) {
      std::vector<uint64_t> orders(static_cast<std::size_t>(world()));
      host_comm().all_gather(&order, orders.data(), 2, DType::f32);  // 8 bytes as two words
      for (int r = 0; r < world(); ++r) {
        SHARDOPT_CHECK(orders[static_cast<std::size_t>(r)] == orders[0], mismatch,
                       "reduce_gradients(): rank {} handed its gradients in another order than rank 0; "
                       "every rank must hand the same parameters in the same order",
                       r);
      }
    }
  }

  // A stage-2 round that has begun must be finished by reduce_gradients() first.
  void finish_open_round_check(const char* what) const {
    SHARDOPT_CHECK(handed_count == 0, invalid_argument,
                   "{}: gradients were handed with reduce_gradient() but the round was not finished "
                   "with reduce_gradients()",
                   what);
  }
};

}  // namespace shardopt
