// src/optim/zero_optimizer_impl.hpp — ZeroOptimizer's internals, shared by the optim and checkpoint modules.
//
// The step pipeline (DESIGN.md): reduce_gradients() averages gradients; step() runs the fused
// update over this rank's shard only, then syncs parameters (one all-gather for the flat
// partition, one broadcast per rank shard for sorted_greedy). Every rank tracks every
// parameter's step count, so per-step scalars never need communication.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
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
#include "optim/flat_buffer.hpp"
#include "optim/host_staging.hpp"
#include "optim/hyperparams.hpp"
#include "partition/partition.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt {
namespace optim {

// Flat shards start on 16-element (64-byte) boundaries: whole cache lines per rank, and
// 16-byte vector access on devices.
constexpr int64_t kShardAlignment = 16;

enum StateKind : std::size_t { kExpAvg = 0, kExpAvgSq, kMaxExpAvgSq, kMomentum, kStateKinds };
inline constexpr const char* kStateNames[kStateKinds] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                  "momentum_buffer"};

struct ParamRecord {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  int32_t group = 0;
  bool trainable = true;
  float* user_param = nullptr;  // external storage only
  float* user_grad = nullptr;
  int64_t step = 0;
  bool has_momentum_buffer = false;  // torch creates it lazily, cloning d_p the first time
};

// A stretch of this rank's shard that one kernel call updates: consecutive elements of
// params in one group with the same step history.
struct UpdateRun {
  int32_t first_param = 0;  // its step count and group stand for the whole run
  int64_t shard_offset = 0;
  int64_t length = 0;
  float* param = nullptr;
  float* grad = nullptr;
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
  std::vector<optim::ParamRecord> params;
  partition::Layout layout;
  bool has_layout = false;
  bool layout_dirty = false;
  uint64_t layout_version = 0;

  std::array<optim::FlatBuffer, optim::kStateKinds> state;  // over this rank's shard

  // Which state kinds exist: the same on every rank, even where a shard is empty.

  std::array<bool, optim::kStateKinds> state_in_use{};
  optim::FlatBuffer flat_params;   // bucket view: trainable shards then frozen params
  optim::FlatBuffer flat_grads;    // bucket view: same offsets as flat_params
  optim::FlatBuffer sync_staging;  // external: the rank-ordered shards, for the param sync
  optim::FlatBuffer grad_staging;  // external: one bucket for reduce_gradients
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
    return std::max<int64_t>(optim::kShardAlignment, config.bucket_bytes / static_cast<int64_t>(sizeof(float)));
  }

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

  // The device all parameters must share, and what fixed it (for messages).
  struct DeviceChoice {
    bool fixed = false;
    Device device = Device::cpu();
    std::string source;
  };
  DeviceChoice current_device_choice() const {
    if (comm->device().is_cuda()) {
      return {true, comm->device(), fmt::format("the {} communicator", comm->backend_name())};
    }
    if (!params.empty()) return {true, device, fmt::format("parameter '{}'", params.front().name)};
    return {};
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
      choice = DeviceChoice{true, d, "parameter " + label};
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

  optim::FlatBuffer new_buffer(int64_t numel) const {
    optim::FlatBuffer buffer(device, stream);
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
  void finish_gradient_average(float* data, int64_t count) const {
    if (host_driven_device_comm && count > 0) optim::divide_device(data, count, static_cast<float>(world()), stream);
  }

  // ---- registration ---------------------------------------------------------------------

  // Checks one group locally and turns its specs into records (not yet added).
  std::vector<optim::ParamRecord> records_for(const ParamGroupSpec& spec, int32_t group_index,
                                              DeviceChoice& choice) const {
    optim::validate_hyperparams(spec.hyper, config.algorithm, group_index);
    SHARDOPT_CHECK(!spec.params.empty(), invalid_argument,
                   "param group {} has an empty parameter list", group_index);
    std::vector<optim::ParamRecord> records;
    for (const ParamSpec& p : spec.params) {
      const std::string label = p.name.empty() ? fmt::format("#{}", params.size() + records.size()) : "'" + p.name + "'";
      SHARDOPT_CHECK(!p.name.empty(), invalid_argument, "parameter {} in group {} has no name", label, group_index);
      SHARDOPT_CHECK(p.param.numel >= 0, invalid_argument, "parameter {} has negative numel {}", label, p.param.numel);
      check_param_device(label, p.param.device, choice);
      SHARDOPT_CHECK(p.param.dtype == DType::f32, unsupported,
                     "parameter {} has dtype {}: only f32 parameters are supported so far", label,
                     dtype_name(p.param.dtype));
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
      r.user_param = static_cast<float*>(p.param.data);
      r.user_grad = static_cast<float*>(p.grad.data);
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
    } catch (const Error& e) {
      local_error = e.what();
      local_code = e.code();
      added.clear();
    }
    std::vector<optim::ParamSignature> signatures;
    for (const optim::ParamRecord& r : added) signatures.push_back({optim::describe(r)});
    optim::check_same_registration(host_comm(), signatures, what, local_error, local_code);

    const std::size_t first_new = params.size();
    for (const ParamGroupSpec& spec : specs) groups.push_back(spec.hyper);
    for (optim::ParamRecord& r : added) params.push_back(std::move(r));
    rebuild_layout(&specs, first_new);
  }

  // ---- layout and state -------------------------------------------------------------------

  std::array<bool, optim::kStateKinds> state_kinds_needed() const {
    std::array<bool, optim::kStateKinds> needed{};
    for (const Hyperparams& h : groups) {
      if (config.algorithm == Algorithm::sgd) {
        needed[optim::kMomentum] = needed[optim::kMomentum] || h.momentum != 0.0;
      } else {
        needed[optim::kExpAvg] = needed[optim::kExpAvgSq] = true;
        needed[optim::kMaxExpAvgSq] = needed[optim::kMaxExpAvgSq] || h.amsgrad;
      }
    }
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
                     std::array<optim::FlatBuffer, optim::kStateKinds>& next) {
    // This rank's new pieces, by param.
    std::vector<std::vector<const partition::Segment*>> mine(params.size());
    for (const partition::Segment& s : to.shards[static_cast<std::size_t>(rank())].segments) {
      mine[static_cast<std::size_t>(s.param)].push_back(&s);
    }
    const bool replicated = from.strategy == partition::Strategy::replicated;
    const int sources = replicated ? 1 : world();
    // One receive buffer for every broadcast (on a device, each allocation would cost a cudaFree).
    optim::FlatBuffer incoming(device, stream);
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
    partition::Layout next = partition::make_layout(strategy(), param_infos(), world(), optim::kShardAlignment);
    const int64_t next_shard = next.shards[static_cast<std::size_t>(rank())].numel;

    // Every kind gets the device, even when empty: ensure_state_kinds() may allocate it later.
    std::array<optim::FlatBuffer, optim::kStateKinds> next_state;
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
      optim::FlatBuffer next_params = new_buffer(tail);
      optim::FlatBuffer next_grads = new_buffer(tail);
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto bytes = static_cast<std::size_t>(params[i].numel) * sizeof(float);
        if (bytes == 0) continue;
        if (i < view_offset.size()) {
          copy_bytes(next_params.data() + next_offset[i], flat_params.data() + view_offset[i], bytes);
          copy_bytes(next_grads.data() + next_offset[i], flat_grads.data() + view_offset[i], bytes);
        } else if (initial != nullptr) {
          const void* source = initial_value(*initial, i - first_new);
          if (source != nullptr) copy_bytes(next_params.data() + next_offset[i], source, bytes);
        }
      }
      // The caller may reuse its initial-value buffers as soon as registration returns.
      if (initial != nullptr && on_device()) device::cuda_synchronize(stream, device, "initial parameter values");
      flat_params = std::move(next_params);
      flat_grads = std::move(next_grads);
      view_offset = std::move(next_offset);
    } else {
      sync_staging = new_buffer(sharded() ? next.buffer_numel : 0);
      int64_t trainable = next.trainable_numel;
      grad_staging = new_buffer(world() > 1 ? std::min(trainable, bucket_elements()) : 0);
    }
    state = std::move(next_state);
    layout = std::move(next);
    has_layout = true;
    layout_dirty = false;
    ++layout_version;
    build_runs();
  }

  static const void* initial_value(const std::vector<ParamGroupSpec>& specs, std::size_t index) {
    for (const ParamGroupSpec& g : specs) {
      if (index < g.params.size()) return g.params[index].param.data;
      index -= g.params.size();
    }
    return nullptr;
  }

  float* param_data(std::size_t i) const {
    return bucket_view() ? flat_params.data() + view_offset[i] : params[i].user_param;
  }
  float* grad_data(std::size_t i) const {
    return bucket_view() ? flat_grads.data() + view_offset[i] : params[i].user_grad;
  }

  void build_runs() {
    runs.clear();
    const partition::RankShard& shard = own_shard();
    for (const partition::Segment& s : shard.segments) {
      if (s.length == 0) continue;
      const optim::ParamRecord& p = params[static_cast<std::size_t>(s.param)];
      float* param_ptr = param_data(static_cast<std::size_t>(s.param)) + s.param_offset;
      float* grad_ptr = grad_data(static_cast<std::size_t>(s.param)) + s.param_offset;
      if (!runs.empty()) {
        optim::UpdateRun& last = runs.back();
        const optim::ParamRecord& q = params[static_cast<std::size_t>(last.first_param)];
        const bool contiguous = last.shard_offset + last.length == s.shard_offset &&
                                last.param + last.length == param_ptr && last.grad + last.length == grad_ptr;
        if (contiguous && q.group == p.group && q.step == p.step && q.has_momentum_buffer == p.has_momentum_buffer) {
          last.length += s.length;
          continue;
        }
      }
      runs.push_back(optim::UpdateRun{s.param, s.shard_offset, s.length, param_ptr, grad_ptr});
    }
  }

  // ---- the step ---------------------------------------------------------------------------

  // Every rank validates its hyperparameters; one tiny all-reduce makes all ranks fail
  // together when any rank's are invalid, instead of leaving the others in the sync.
  void agree_on_hyperparams() {
    std::string local_error;
    for (std::size_t g = 0; g < groups.size() && local_error.empty(); ++g) {
      try {
        optim::validate_hyperparams(groups[g], config.algorithm, static_cast<int>(g));
      } catch (const Error& e) {
        local_error = e.what();
      }
    }
    float failed_rank = local_error.empty() ? 0.f : static_cast<float>(rank() + 1);
    if (world() > 1) host_comm().all_reduce(&failed_rank, 1, DType::f32, ReduceOp::max);
    if (!local_error.empty()) throw Error(ErrorCode::invalid_argument, local_error);
    SHARDOPT_CHECK(failed_rank == 0.f, invalid_argument,
                   "step refused: rank {} has invalid hyperparameters (its error names them)",
                   static_cast<int>(failed_rank) - 1);
  }

  void update_shard() {
    const int threads = config.cpu_threads;
    for (const optim::UpdateRun& run : runs) {
      const optim::ParamRecord& p = params[static_cast<std::size_t>(run.first_param)];
      const Hyperparams& h = groups[static_cast<std::size_t>(p.group)];
      float* exp_avg = state[optim::kExpAvg].data() + run.shard_offset;
      if (config.algorithm == Algorithm::sgd) {
        const kernels::SgdScalars s = kernels::make_sgd_scalars(
            h.lr, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.maximize, !p.has_momentum_buffer);
        float* momentum = state[optim::kMomentum].empty() ? nullptr : state[optim::kMomentum].data() + run.shard_offset;
        if (on_device()) {
          optim::sgd_update_device(run.param, run.grad, momentum, run.length, s, stream);
        } else {
          kernels::sgd_update_cpu(run.param, run.grad, momentum, run.length, s, threads);
        }
      } else {
        const kernels::AdamScalars s = kernels::make_adam_scalars(
            h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, config.algorithm == Algorithm::adamw,
            h.amsgrad, h.maximize, p.step + 1);
        float* max_sq = state[optim::kMaxExpAvgSq].empty() ? nullptr : state[optim::kMaxExpAvgSq].data() + run.shard_offset;
        if (on_device()) {
          optim::adam_update_device(run.param, run.grad, exp_avg, state[optim::kExpAvgSq].data() + run.shard_offset,
                                    max_sq, run.length, s, stream);
        } else {
          kernels::adam_update_cpu(run.param, run.grad, exp_avg, state[optim::kExpAvgSq].data() + run.shard_offset,
                                   max_sq, run.length, s, threads);
        }
      }
    }
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
      float* user = params[static_cast<std::size_t>(s.param)].user_param + s.param_offset;
      float* staged = sync_staging.data() + shard.offset + s.shard_offset;
      const auto bytes = static_cast<std::size_t>(s.length) * sizeof(float);
      if (bytes == 0) continue;
      if (to_staging) copy_bytes(staged, user, bytes);
      else copy_bytes(user, staged, bytes);
    }
  }

  // Every rank's shard of `buffer` (laid out as layout.shards) reaches every rank.
  void exchange_shards(float* buffer) {
    settle_before_collective();
    if (layout.strategy == partition::Strategy::flat) {
      const int64_t count = own_shard().numel;
      if (count > 0) comm->all_gather(buffer + own_shard().offset, buffer, count, DType::f32);
      return;
    }
    // sorted_greedy: shards differ in size; one broadcast per rank, cut into buckets, all in
    // flight together.
    std::vector<std::unique_ptr<PendingCollective>> pending;
    for (int r = 0; r < world(); ++r) {
      const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      for (int64_t begin = 0; begin < shard.numel; begin += bucket_elements()) {
        const int64_t count = std::min(bucket_elements(), shard.numel - begin);
        pending.push_back(comm->broadcast_async(buffer + shard.offset + begin, count, DType::f32, r));
      }
    }
    for (auto& p : pending) p->wait();
  }

  void sync_params() {
    if (!sharded()) return;
    if (bucket_view()) {
      exchange_shards(flat_params.data());
      return;
    }
    copy_segments(own_shard(), /*to_staging=*/true);
    exchange_shards(sync_staging.data());
    for (int r = 0; r < world(); ++r) {
      if (r != rank()) copy_segments(layout.shards[static_cast<std::size_t>(r)], /*to_staging=*/false);
    }
  }

  void step() {
    const device::ScopedDevice scope(device);
    if (layout_dirty) rebuild_layout();
    agree_on_hyperparams();
    ensure_state_kinds();
    update_shard();
    sync_params();
  }

  void reduce_gradients() {
    const device::ScopedDevice scope(device);
    if (layout_dirty) rebuild_layout();
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
        slot = comm->all_reduce_async(flat_grads.data() + begin, count, DType::f32, gradient_average_op());
      }
      for (auto& slot : in_flight) {
        if (slot) slot->wait();
      }
      finish_gradient_average(flat_grads.data(), total);
      return;
    }
    // External: pack trainable grads into one staging bucket at a time, average, unpack.
    struct Piece { float* grad; int64_t offset; int64_t length; };
    std::vector<Piece> pieces;
    int64_t filled = 0;
    auto flush = [&] {
      if (filled == 0) return;
      settle_before_collective();
      comm->all_reduce(grad_staging.data(), filled, DType::f32, gradient_average_op());
      finish_gradient_average(grad_staging.data(), filled);
      for (const Piece& piece : pieces) {
        copy_bytes(piece.grad, grad_staging.data() + piece.offset, static_cast<std::size_t>(piece.length) * sizeof(float));
      }
      pieces.clear();
      filled = 0;
    };
    for (const optim::ParamRecord& p : params) {
      if (!p.trainable) continue;
      for (int64_t done = 0; done < p.numel;) {
        const int64_t length = std::min(p.numel - done, grad_staging.numel() - filled);
        copy_bytes(grad_staging.data() + filled, p.user_grad + done, static_cast<std::size_t>(length) * sizeof(float));
        pieces.push_back(Piece{p.user_grad + done, filled, length});
        filled += length;
        done += length;
        if (filled == grad_staging.numel()) flush();
      }
    }
    flush();
  }
};

}  // namespace shardopt
