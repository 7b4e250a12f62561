// bench/src/cuda_step.cpp — times ZeroOptimizer::step() on CUDA parameters, sets it against the device-to-device roofline measured in the same run, and checks the parameters against the CPU path.
#include "cuda_step.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuda_device.hpp"
#include "model.hpp"
#include "roofline.hpp"
#include "support.hpp"
#include "verify.hpp"

namespace shardopt_bench {

using shardopt::Device;
using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

namespace {

constexpr int64_t MiB = int64_t{1} << 20;
constexpr int kBandwidthReps = 10;

// Each pattern's best over two measurement windows.
D2DBandwidth best_of(const D2DBandwidth& a, const D2DBandwidth& b) {
  D2DBandwidth best = b;
  best.memcpy_gbps = std::max(a.memcpy_gbps, b.memcpy_gbps);
  best.copy_gbps = std::max(a.copy_gbps, b.copy_gbps);
  best.update_gbps = std::max(a.update_gbps, b.update_gbps);
  return best;
}

}  // namespace

// The synthetic values of the whole model (`params`: parameters, else gradients) into device
// memory at `device_base` (one element of o.dtype per model element), a tensor at a time
// through host memory.
void upload_model_values(void* device_base, const Model& model, const Options& o, bool params) {
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  std::vector<uint32_t> host;
  for (const Tensor& t : model.tensors) {
    host.resize(static_cast<std::size_t>((t.numel * element_bytes + 3) / 4));
    const TensorRef out{host.data(), t.numel, o.dtype, Device::cpu()};
    if (params) fill_param_values(out, t.offset, o.threads);
    else fill_grad_values(out, t.offset, o);
    copy_to_device(static_cast<char*>(device_base) + t.offset * element_bytes, host.data(), t.numel * element_bytes);
  }
}

// A device view's values into `scratch`, as a host TensorRef (the check's ParamReader).
TensorRef read_to_host(const TensorRef& view, std::vector<uint32_t>& scratch) {
  scratch.resize(static_cast<std::size_t>((view.nbytes() + 3) / 4));
  copy_to_host(scratch.data(), view.data, view.nbytes());
  return TensorRef{scratch.data(), view.numel, view.dtype, Device::cpu()};
}

void upload_grad_views(ZeroOptimizer& opt, const std::vector<Tensor>& by_id, const Options& o) {
  std::vector<uint32_t> host_grad;
  for (std::size_t i = 0; i < by_id.size(); ++i) {
    const Tensor& t = by_id[i];
    const TensorRef view = opt.grad_view(static_cast<shardopt::ParamId>(i));
    host_grad.resize(static_cast<std::size_t>((view.nbytes() + 3) / 4));
    fill_grad_values(TensorRef{host_grad.data(), t.numel, o.dtype, Device::cpu()}, t.offset, o);
    copy_to_device(view.data, host_grad.data(), view.nbytes());
  }
}

CudaTiming time_cuda_steps(Communicator& host, ZeroOptimizer& opt, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) opt.step();
  synchronize_device();
  StreamTimer timer;
  void* const stream = opt.cuda_stream();
  std::vector<double> mine;  // [wall, event] of every timed step
  for (int i = 0; i < iters; ++i) {
    synchronize_device();
    host.barrier();
    const auto start = Clock::now();
    timer.start(stream);
    opt.step();
    timer.stop(stream);
    // The whole device, not only the optimizer's stream: NCCL's stream too, whatever the
    // library's ordering of them.
    synchronize_device();
    const double wall = seconds_since(start);
    mine.insert(mine.end(), {wall, timer.seconds()});
    host.barrier();
  }
  const std::vector<double> all = all_gather_exact(host, mine);
  std::vector<double> wall, event;
  for (std::size_t i = 0; i < static_cast<std::size_t>(iters); ++i) {
    double w = 0, e = 0;
    for (int r = 0; r < host.size(); ++r) {
      const double* row = &all[static_cast<std::size_t>(r) * mine.size() + 2 * i];
      w = std::max(w, row[0]);
      e = std::max(e, row[1]);
    }
    wall.push_back(w);
    event.push_back(e);
  }
  return CudaTiming{median(wall), median(event)};
}

// A GPU's name as one token of the key=value line.
std::string token(std::string text) {
  std::replace(text.begin(), text.end(), ' ', '_');
  return text;
}

int run_cuda_step(const std::shared_ptr<Communicator>& host, const std::shared_ptr<Communicator>& device_comm,
                  const Options& flags) {
  // The CPU reference and the synthetic values use every core unless --threads says otherwise.
  Options o = flags;
  if (!o.threads_given) o.threads = 0;
  const int world = host->size();
  const int rank = host->rank();
  const Model model = make_model(o);
  const OptimizerConfig config = make_config(o);
  const bool sharded = o.sharded && world > 1;
  const DeviceInfo info = current_device_info();
  const Device device = Device::cuda(info.index);
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));

  // Arrays far beyond the L2 cache, the same on every rank; the first window before the model
  // takes its memory.
  const int64_t array_bytes = o.stream_mb > 0 ? o.stream_mb * MiB : std::max<int64_t>(8 * info.l2_bytes, 512 * MiB);
  const D2DBandwidth before = measure_d2d_bandwidth(array_bytes, kBandwidthReps);

  // Parameters in cudaMalloc'd memory holding their initial values; gradients on the device.
  ParamGroupSpec group = make_group(o, model.tensors, device);
  auto params = std::make_unique<DeviceBuffer>(model.numel * element_bytes);
  upload_model_values(params->data(), model, o, true);
  std::unique_ptr<DeviceBuffer> grads;
  if (config.storage == Storage::external) {
    grads = std::make_unique<DeviceBuffer>(model.numel * element_bytes);
    upload_model_values(grads->data(), model, o, false);
  }
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const int64_t at = model.tensors[i].offset * element_bytes;
    group.params[i].param.data = static_cast<char*>(params->data()) + at;
    if (grads) group.params[i].grad.data = static_cast<char*>(grads->data()) + at;
  }
  ZeroOptimizer opt(device_comm, config, {std::move(group)});
  if (config.storage == Storage::bucket_view) {
    // The optimizer copied the initial values into its own buffer: ours can go, and the
    // gradients are written into its grad views.
    synchronize_device();
    params.reset();
    upload_grad_views(opt, model.tensors, o);
  }

  const CudaTiming timing = time_cuda_steps(*host, opt, o.warmup, o.iters);
  const shardopt::MemoryReport memory = opt.memory_report();

  // Bytes each rank's step must move in its own memory (roofline.hpp's counts).
  const std::vector<int64_t> shards = gather_int64(*host, memory.shard_numel);
  int64_t all_shards = 0, my_offset = 0;
  for (std::size_t r = 0; r < shards.size(); ++r) {
    all_shards += shards[r];
    if (static_cast<int>(r) < rank) my_offset += shards[r];
  }
  const int64_t my_updated = o.sharded && o.partition == PartitionStrategy::flat
                                 ? std::clamp<int64_t>(memory.trainable_numel - my_offset, 0, memory.shard_numel)
                                 : memory.shard_numel;
  const int64_t my_moved = sharded ? all_shards - memory.shard_numel : 0;
  const int64_t my_update_bytes = my_updated * update_bytes_per_param(update_shape(o), o.dtype);
  const int64_t my_sync_bytes = 2 * element_bytes * my_moved;
  const int64_t update_bytes = sum_int64(*host, my_update_bytes);
  const int64_t sync_bytes = sum_int64(*host, my_sync_bytes);

  // Does a step's data fit in the L2 cache (then it is not bound by device memory)?
  const int64_t touched = model.numel * element_bytes + my_updated * element_bytes + memory.state_bytes + memory.master_bytes;
  const bool resident_here = static_cast<double>(touched) <= kCacheResidentFactor * static_cast<double>(info.l2_bytes);
  const bool cache_resident = max_int64(*host, resident_here ? 0 : 1) == 0;

  // The second bandwidth window, then each rank's roofline at its own best bandwidth; the
  // step waits for the slowest.
  const D2DBandwidth d2d = best_of(before, measure_d2d_bandwidth(array_bytes, kBandwidthReps));
  const double my_roofline_s = static_cast<double>(my_update_bytes + my_sync_bytes) / (d2d.best_gbps() * 1e9);
  const std::vector<double> rooflines = all_gather_exact(*host, std::vector<double>{my_roofline_s, d2d.memcpy_gbps, d2d.copy_gbps, d2d.update_gbps});
  double roofline_s = 0;
  D2DBandwidth slowest = d2d;  // each pattern's lowest over the GPUs: the figures printed
  for (int r = 0; r < world; ++r) {
    const double* row = &rooflines[static_cast<std::size_t>(r) * 4];
    roofline_s = std::max(roofline_s, row[0]);
    slowest.memcpy_gbps = std::min(slowest.memcpy_gbps, row[1]);
    slowest.copy_gbps = std::min(slowest.copy_gbps, row[2]);
    slowest.update_gbps = std::min(slowest.update_gbps, row[3]);
  }
  const double step_s = timing.step_s;
  const RooflineVerdict verdict = judge_roofline(roofline_s, step_s, cache_resident);
  const int64_t busiest_bytes = max_int64(*host, my_update_bytes + my_sync_bytes);

  std::string wrong = "N/A";
  int64_t wrong_total = 0;
  if (o.check) {
    wrong_total = count_wrong_params(host, o, model, opt, o.warmup + o.iters,
                                     [&](shardopt::ParamId id, std::vector<uint32_t>& scratch) {
                                       return read_to_host(opt.param_view(id), scratch);
                                     },
                                     InitialValues::at_registration);
    wrong = std::to_string(wrong_total);
  }

  say(*host,
      "device=cuda gpu={} comm={} world={} params={} {} optimizer={} partition={} dtype={} stage={} storage={} "
      "bucket_bytes={} pipeline_chunk_bytes={} mode={} iters={} warmup={} shard_numel_max={} state_bytes_per_rank={} "
      "master_bytes_per_rank={} grad_bytes_per_rank={} update_bytes={} sync_bytes={} d2d_memcpy_gbps={:.1f} "
      "d2d_copy_gbps={:.1f} d2d_update_gbps={:.1f} d2d_array_mb={} l2_mb={} roofline_gbps={:.1f} roofline_pattern={} "
      "roofline_ms={:.3f} gpu_event_ms_median={:.3f} step_ms_median={:.3f} params_per_s={:.4g} achieved_gbps_per_gpu={:.1f} "
      "step_over_roofline={:.3f} roofline_fraction={} roofline_status={} wrong={}\n",
      token(info.name), device_comm->backend_name(), world, model.numel, model.description,
      shardopt::algorithm_name(o.algorithm), shardopt::partition_name(o.partition), shardopt::dtype_name(o.dtype),
      config.stage, o.storage == Storage::bucket_view ? "bucket_view" : "external", o.bucket_bytes,
      o.pipeline_chunk_bytes, o.sharded ? "sharded" : "replicated", o.iters, o.warmup,
      *std::max_element(shards.begin(), shards.end()), max_int64(*host, memory.state_bytes),
      max_int64(*host, memory.master_bytes), max_int64(*host, memory.grad_bytes), update_bytes, sync_bytes,
      slowest.memcpy_gbps, slowest.copy_gbps, slowest.update_gbps, d2d.array_bytes / MiB, info.l2_bytes / MiB,
      slowest.best_gbps(), slowest.best_pattern(), roofline_s * 1e3, timing.event_s * 1e3, step_s * 1e3,
      step_s > 0 ? static_cast<double>(model.numel) / step_s : 0.0,
      step_s > 0 ? static_cast<double>(busiest_bytes) / step_s / 1e9 : 0.0, roofline_s > 0 ? step_s / roofline_s : 0.0,
      format_fraction(verdict), status_name(verdict.status), wrong);
  if (wrong_total != 0) return 1;
  return verdict.status == RooflineStatus::measurement_error ? 3 : 0;
}

}  // namespace shardopt_bench
