// tools/demo/train.cpp — one training run: the MLP's parameters registered with shardopt, stepped and checked.
#include "train.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "counting_comm.hpp"
#include "data.hpp"
#include "measure.hpp"
#include "mlp.hpp"
#include "params.hpp"

namespace shardopt_demo {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

const char* run_kind_name(RunKind kind) {
  switch (kind) {
    case RunKind::sharded: return "sharded";
    case RunKind::replicated: return "replicated";
    case RunKind::local_sgd: return "local_sgd";
  }
  return "?";
}

// Adds the wall time of `call` to `total` (milliseconds): the trainer-visible optimizer time.
template <typename F>
void timed(double& total, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

ModeResult train(const std::shared_ptr<Communicator>& world, const Options& options, RunKind kind,
                 bool overlap) {
  Communicator& comm = *world;
  const int rank = comm.rank();
  const ModelShape shape = model_shape(options);
  const int64_t width = shape.width, weight_numel = shape.weight_numel;
  const int64_t layer_numel = shape.layer_numel, total_numel = shape.total_numel;
  const bool external = options.storage == shardopt::Storage::external;
  const DType dtype = options.dtype;
  const bool half = dtype != DType::f32;
  const bool local_sgd = kind == RunKind::local_sgd;
  const bool shard_state = kind != RunKind::replicated;
  // Stage 2 shards gradients by the state's partition, so the replicated baseline is stage 1.
  const int stage = shard_state ? options.stage : 1;
  // Stage 2 with bucket view has no grad_view(): each gradient is handed with reduce_gradient().
  const bool hand_gradients = stage == 2 && !external;
  // f32 gradients that the optimizer reads from a buffer (grad_view(): its own at stage 1, our
  // external ones otherwise) are written there directly by the backward. Otherwise the backward
  // writes each layer into one f32 scratch that a per-layer hook narrows into grad_view() or
  // hands to reduce_gradient(), as a trainer's backward hooks would.
  const bool direct_grads = !half && !hand_gradients;

  // The optimizers see the world (and the replica) through counters; the demo's own
  // collectives (barriers, the loss, the final check) use `world` itself and are not counted.
  // Local SGD: the replica is a split of the world, each of its ranks a consecutive world rank.
  const auto world_counter = std::make_shared<ByteCounter>();
  const auto replica_counter = std::make_shared<ByteCounter>();
  std::shared_ptr<Communicator> counted_world =
      std::make_shared<Communicator>(std::make_shared<CountingCommunicator>(world, world_counter));
  std::shared_ptr<Communicator> replica;  // local SGD only, not counted
  std::shared_ptr<Communicator> optimizer_comm = counted_world;
  if (local_sgd) {
    const int replica_size = options.local_sgd.replica;
    replica = world->split(rank / replica_size, rank);
    optimizer_comm = std::make_shared<Communicator>(std::make_shared<CountingCommunicator>(replica, replica_counter));
  }

  ModelParams model = make_model_params(options);
  shardopt::OptimizerConfig config;
  config.algorithm = options.algorithm;
  config.partition = options.partition;
  config.storage = options.storage;
  config.shard_state = shard_state;
  config.stage = stage;
  config.master = options.master;
  config.state_precision = options.state_precision;
  config.cpu_threads = options.threads;
  config.overlap = overlap ? options.overlap : shardopt::OverlapPolicy::off;
  // --local-sgd compares the bytes each mode sends through the communicator, as between nodes:
  // node-shared memory would average the synchronous run's gradients on this node outside it.
  if (options.local_sgd.enabled) config.node_shared_params = false;
  // f16 gradients underflow without a loss scale (torch.cuda.amp.GradScaler's defaults).
  config.loss_scaling.enabled = dtype == DType::f16;
  std::vector<shardopt::ParamGroupSpec> groups = optimizer_groups(model, options);
  ZeroOptimizer opt(optimizer_comm, config, std::move(groups));
  model.free_staging();
  std::unique_ptr<shardopt::PostLocalSGDOptimizer> post_local;
  if (local_sgd) {
    post_local = std::make_unique<shardopt::PostLocalSGDOptimizer>(counted_world, opt,
                                                                    averager_config(options.local_sgd));
  }
  // The three calls a step makes, through the wrapper when there is one. communication()'s
  // gradient_bytes already counts the replica's own gradient reduction, so what the replica
  // hands to collectives inside the two gradient calls is set apart, not added again.
  int64_t replica_gradient_bytes = 0;
  const auto reduce_gradients = [&] {
    const int64_t before = replica_counter->bytes;
    if (post_local) post_local->reduce_gradients();
    else opt.reduce_gradients();
    replica_gradient_bytes += replica_counter->bytes - before;
  };
  const auto reduce_gradient = [&](shardopt::ParamId id, const TensorRef& grad) {
    const int64_t before = replica_counter->bytes;
    if (post_local) post_local->reduce_gradient(id, grad);
    else opt.reduce_gradient(id, grad);
    replica_gradient_bytes += replica_counter->bytes - before;
  };
  const auto step_optimizer = [&] {
    if (post_local) post_local->step();
    else opt.step();
  };

  // peak_rss_mb is this process's (rank 0's, as printed) high-water mark from here to the end
  // of the mode: parameters, gradients, optimizer state, activations, the f32 working copies
  // of 16-bit parameters and communication buffers (transient ones included), but neither the
  // initial-value staging just freed nor anything left over from the previous mode.
  const bool peak_is_per_mode = reset_peak_rss();
  if (!peak_is_per_mode && rank == 0) {
    std::fprintf(stderr, "shardopt-demo: note: cannot reset the peak RSS; peak_rss_mb is the "
                         "process-lifetime peak\n");
  }

  std::vector<shardopt::ParamId> weight_id(static_cast<std::size_t>(options.layers));
  std::vector<shardopt::ParamId> bias_id(weight_id.size());
  for (int l = 0; l < options.layers; ++l) {
    weight_id[l] = opt.find_param(layer_param_name(l, "weight"));
    bias_id[l] = opt.find_param(layer_param_name(l, "bias"));
  }
  // 16-bit parameters: the f32 copies the forward/backward reads, layer after layer.
  std::vector<float> work(half ? static_cast<std::size_t>(total_numel) : 0);
  // One layer's f32 gradients, consumed by the hook before the next layer overwrites them.
  std::vector<float> grad_scratch(direct_grads ? 0 : static_cast<std::size_t>(layer_numel));
  // Stage 2, 16-bit: the narrowed gradients handed to reduce_gradient() (read before it returns).
  std::vector<uint16_t> hand_scratch(hand_gradients && half ? static_cast<std::size_t>(layer_numel) : 0);

  // Views can move when the layout is rebuilt, so look them up again whenever it changes.
  std::vector<LinearTensors> net(static_cast<std::size_t>(options.layers));
  uint64_t seen_layout = 0;
  bool have_views = false;
  const auto refresh_views = [&] {
    if (have_views && opt.layout_version() == seen_layout) return;
    for (int l = 0; l < options.layers; ++l) {
      const shardopt::ParamId w = weight_id[l];
      const shardopt::ParamId b = bias_id[l];
      LinearTensors t;
      if (half) {
        t.weight = work.data() + l * layer_numel;
        t.bias = t.weight + weight_numel;
      } else {
        t.weight = opt.param_view(w).as<float>();
        t.bias = opt.param_view(b).as<float>();
      }
      if (direct_grads) {
        t.weight_grad = opt.grad_view(w).as<float>();
        t.bias_grad = opt.grad_view(b).as<float>();
      } else {
        t.weight_grad = grad_scratch.data();
        t.bias_grad = grad_scratch.data() + weight_numel;
      }
      net[l] = t;
    }
    seen_layout = opt.layout_version();
    have_views = true;
  };
  // 16-bit parameters -> the f32 working copies (after every step, outside the timed region).
  const auto widen_params = [&] {
    for (int l = 0; l < options.layers; ++l) {
      widen(opt.param_view(weight_id[l]), work.data() + l * layer_numel);
      widen(opt.param_view(bias_id[l]), work.data() + l * layer_numel + weight_numel);
    }
  };
  // The backward hook: layer l's f32 gradients (in grad_scratch), scaled by the loss scale,
  // go to the optimizer: narrowed into grad_view() (stage 1, or external buffers), or handed
  // with reduce_gradient() (stage 2, bucket view), weight then bias, in backward order.
  // Time inside shardopt calls in the current iteration (see ModeResult::visible_ms_median).
  double visible_ms = 0.0;
  std::function<void(int)> layer_done;
  if (overlap && direct_grads) {
    // Stage 1, f32: the gradients are already in grad_view(); their bucket may start now.
    layer_done = [&](int l) {
      timed(visible_ms, [&] {
        opt.grad_ready(weight_id[l]);
        opt.grad_ready(bias_id[l]);
      });
    };
  } else if (!direct_grads) {
    layer_done = [&](int l) {
      const float scale = static_cast<float>(opt.loss_scale());
      const shardopt::ParamId ids[2] = {weight_id[l], bias_id[l]};
      const int64_t offsets[2] = {0, weight_numel};
      const int64_t numels[2] = {weight_numel, width};
      for (int k = 0; k < 2; ++k) {
        const float* src = grad_scratch.data() + offsets[k];
        if (hand_gradients) {
          TensorRef grad{const_cast<float*>(src), numels[k], DType::f32, shardopt::Device::cpu()};
          if (half) {
            uint16_t* dst = hand_scratch.data() + offsets[k];
            narrow(src, numels[k], scale, dtype, dst);
            grad.data = dst;
            grad.dtype = dtype;
          }
          timed(visible_ms, [&] { reduce_gradient(ids[k], grad); });
        } else {
          narrow(src, numels[k], scale, dtype, opt.grad_view(ids[k]).as<uint16_t>());
          if (overlap) timed(visible_ms, [&] { opt.grad_ready(ids[k]); });
        }
      }
    };
  }

  // Overlap: the next forward waits for each layer's new values just before using them (and,
  // 16-bit, widens that layer then instead of all layers after step()).
  std::function<void(int)> before_layer;
  if (overlap) {
    before_layer = [&](int l) {
      timed(visible_ms, [&] {
        opt.wait_param(weight_id[l]);
        opt.wait_param(bias_id[l]);
      });
      if (half) {
        widen(opt.param_view(weight_id[l]), work.data() + l * layer_numel);
        widen(opt.param_view(bias_id[l]), work.data() + l * layer_numel + weight_numel);
      }
    };
  }

  const std::string mode_label = std::string(run_kind_name(kind)) + (overlap ? "_overlap" : "");
  const char* const mode_name = mode_label.c_str();
  if (!options.resume_dir.empty()) {
    const std::string dir = options.resume_dir + "/" + mode_name;
    if (post_local) post_local->load(dir);
    else opt.load(dir);
  }
  refresh_views();
  if (half) widen_params();

  Mlp mlp(options.layers, options.width, options.batch);
  std::vector<float> input(static_cast<std::size_t>(options.batch) * width);
  std::vector<float> target(input.size());
  make_batch(options.seed, rank, input, target);
  std::vector<double> step_ms;
  std::vector<double> visible_step_ms;
  std::vector<double> iter_ms;
  double loss = 0.0;
  // Only the steps count: neither the construction nor --resume/--save.
  const int64_t world_bytes_before = world_counter->bytes;
  const int64_t replica_bytes_before = replica_counter->bytes;
  const shardopt::CommunicationCounts local_before =
      post_local ? post_local->communication() : shardopt::CommunicationCounts{};
  // --uneven: this rank's share of the data runs out after steps + rank batches; join() then
  // takes its part in the others' steps. The demo's own collectives (the barriers around the
  // timed step, the verbose loss) would meet join()'s agreements, so they are left out.
  const int my_steps = options.uneven ? options.steps + rank : options.steps;
  // Overlap: the optimizer's collectives are queued on its communication thread after step()
  // returns; the demo's would race them, so they are left out as well.
  const bool own_collectives = !options.uneven && !overlap;
  for (int step = 0; step < my_steps; ++step) {
    refresh_views();
    // The backward pass overwrites the gradients, so no zero_grad() is needed.
    visible_ms = 0.0;
    double compute_ms = 0.0;  // forward/backward (its hooks included) and the gradient calls
    timed(compute_ms, [&] {
      loss = mlp.forward_backward(net, input.data(), target.data(), layer_done, before_layer);
      timed(visible_ms, reduce_gradients);
      if (options.clip > 0.0) timed(visible_ms, [&] { opt.clip_grad_norm(options.clip); });
    });

    // Time step() alone, between barriers, as one times torch's opt.step(): the update of
    // this rank's shard plus (sharded) the parameter sync (local SGD: and the averaging).
    if (own_collectives) comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    step_optimizer();
    const auto stop = std::chrono::steady_clock::now();
    if (own_collectives) comm.barrier();
    step_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
    // The next forward's waits belong to the next iteration; step() counts in this one.
    visible_step_ms.push_back(visible_ms + step_ms.back());
    iter_ms.push_back(compute_ms + step_ms.back());
    if (half && !overlap) {
      refresh_views();
      widen_params();
    }

    if (options.verbose && own_collectives) {
      float mean_loss = static_cast<float>(loss);
      comm.all_reduce(&mean_loss, 1, DType::f32, shardopt::ReduceOp::avg);
      if (rank == 0) {
        const shardopt::StepReport& report = opt.last_step();
        std::string extra;
        char buffer[128];
        if (config.loss_scaling.enabled) {
          std::snprintf(buffer, sizeof buffer, " loss_scale=%g skipped=%s skipped_steps=%" PRId64,
                        report.loss_scale, report.skipped ? "yes" : "no", report.skipped_steps);
          extra += buffer;
        }
        if (options.clip > 0.0) {
          std::snprintf(buffer, sizeof buffer, " grad_norm=%.6e clip_coef=%.6f", report.grad_norm,
                        report.clip_coef);
          extra += buffer;
        }
        std::printf("step=%d loss=%.6f%s (mode=%s)\n", step, static_cast<double>(mean_loss),
                    extra.c_str(), mode_name);
      }
    }
  }

  if (options.uneven) opt.join();  // returns once every rank is out of batches
  // The last step's all-gathers are still queued; the checks below read every parameter and
  // use the communicator directly.
  if (overlap) opt.wait_all();
  // 16-bit: the sum below reads the f32 working copies. With overlap the forward widens each
  // layer as it waits for it, and join() steps without the loop, so widen the final values.
  if (half) {
    refresh_views();
    widen_params();
  }

  const int64_t world_bytes = world_counter->bytes - world_bytes_before;
  const int64_t replica_bytes = replica_counter->bytes - replica_bytes_before;
  shardopt::CommunicationCounts local_counts;
  if (post_local) {
    const shardopt::CommunicationCounts& after = post_local->communication();
    local_counts.gradient_bytes = after.gradient_bytes - local_before.gradient_bytes;
    local_counts.averaging_bytes = after.averaging_bytes - local_before.averaging_bytes;
    local_counts.averages = after.averages - local_before.averages;
  }

  if (!options.save_dir.empty()) {
    const std::string dir = options.save_dir + "/" + mode_name;
    if (post_local) post_local->save(dir);
    else opt.save(dir);
  }
  // The last step's loss over the whole world, outside the counters.
  float final_loss = static_cast<float>(loss);
  comm.all_reduce(&final_loss, 1, DType::f32, shardopt::ReduceOp::avg);

  refresh_views();
  double sum = 0.0;
  for (int l = 0; l < options.layers; ++l) {
    for (int64_t i = 0; i < weight_numel; ++i) sum += net[l].weight[i];
    for (int64_t i = 0; i < width; ++i) sum += net[l].bias[i];
  }
  // After step() every rank of a replica (all of them but with local SGD) must hold the same
  // parameters. Compare the sums bit for bit: the replica's first rank's 8 bytes travel as two
  // f32 words (a broadcast does not interpret them).
  Communicator& same_params = replica ? *replica : comm;
  double root_sum = sum;
  same_params.broadcast(&root_sum, 2, DType::f32, 0);
  float differs = std::memcmp(&root_sum, &sum, sizeof sum) != 0 ? 1.0f : 0.0f;
  comm.all_reduce(&differs, 1, DType::f32, shardopt::ReduceOp::max);
  if (differs != 0.0f) {
    throw shardopt::Error(shardopt::ErrorCode::mismatch,
                          std::string(replica ? "ranks of one replica" : "ranks") +
                              " hold different parameters after mode=" + mode_name);
  }

  const shardopt::MemoryReport memory = opt.memory_report();
  if (options.verbose && rank == 0) {
    std::printf("memory: state_bytes=%" PRId64 " master_bytes=%" PRId64 " param_bytes=%" PRId64
                " grad_bytes=%" PRId64 " buffer_bytes=%" PRId64 " shard_numel=%" PRId64 " trainable_numel=%" PRId64
                " skipped_steps=%" PRId64 " (mode=%s, rank 0)\n",
                memory.state_bytes, memory.master_bytes, memory.param_bytes, memory.grad_bytes,
                memory.buffer_bytes, memory.shard_numel, memory.trainable_numel, opt.last_step().skipped_steps, mode_name);
  }
  ModeResult result;
  result.params = total_numel;
  result.stage = stage;
  result.state_bytes = memory.state_bytes + memory.master_bytes;
  result.grad_bytes = memory.grad_bytes;
  result.peak_rss_mb = peak_rss_mib();
  result.step_ms_median = median(step_ms);
  result.visible_ms_median = median(visible_step_ms);
  result.iter_ms_median = median(iter_ms);
  result.params_sum = sum;
  result.final_loss = static_cast<double>(final_loss);
  result.steps = options.steps;
  if (post_local) {
    result.local = local_counts;
    result.replica_bytes = replica_bytes - replica_gradient_bytes;
    result.replica_gradient_bytes = replica_gradient_bytes;
    result.world_counted_bytes = world_bytes;
    result.comm_bytes = local_counts.gradient_bytes + local_counts.averaging_bytes + result.replica_bytes;
    result.replicas = post_local->averager().num_replicas();
  } else {
    result.comm_bytes = world_bytes;
  }
  return result;
}

}  // namespace shardopt_demo
