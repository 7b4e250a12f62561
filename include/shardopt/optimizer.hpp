// shardopt/optimizer.hpp — ZeroOptimizer: registered params, param groups, the sharded step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/export.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/types.hpp"

namespace shardopt {

// muon: torch.optim.Muon (torch 2.9+), for 2-D parameters; each matrix is updated whole by one
// rank (see ParamSpec::shape and OptimizerConfig::muon).
enum class Algorithm : int32_t { sgd = 0, adam = 1, adamw = 2, muon = 3 };
enum class PartitionStrategy : int32_t { flat = 0, sorted_greedy = 1 };
enum class Storage : int32_t {
  bucket_view = 0,  // shardopt owns flat param/grad buffers and hands out views (zero-copy sync)
  external = 1,     // the caller's buffers stay where they are; shardopt copies to/from them
};

// How the step overlaps the trainer's backward and forward (ZeroOptimizer::grad_ready,
// reduce_gradient, wait_param). Bucket view storage only; results are bitwise those of off.
enum class OverlapPolicy : int32_t {
  off = 0,             // reduce_gradients() and step() do all their work inside the call
  after_backward = 1,  // reductions overlap backward; step() updates, then the all-gathers
                       // overlap the next forward (wait_param)
  per_bucket = 2,      // a bucket's shard part is updated and gathered as soon as its
                       // reduction lands (no clipping or loss scaling). Its new values may
                       // be written while backward still runs: hand a parameter over only
                       // once backward no longer reads it (after the input gradient through
                       // its layer is computed), as with torch's overlap_with_ddp.
};

// How Adam's moments (and SGD's momentum) are stored over the shard.
enum class StatePrecision : int32_t {
  fp32 = 0,  // one float per element and moment
  q8 = 1,    // 8-bit blockwise moments (bitsandbytes' dynamic quantisation); not yet supported
};
// How the fp32 master of a bf16/f16 parameter is kept (f32 parameters are their own master).
enum class MasterStorage : int32_t {
  fp32 = 0,         // a separate fp32 copy (4 bytes per element)
  remainder16 = 1,  // bf16 parameters only: the master is the parameter's bits and a 16-bit
                    // remainder (2 bytes per element). The masters are bitwise those of fp32;
                    // the parameter is the master rounded half away from zero (the remainder's
                    // sign bit), which differs from nearest-even only at exact ties.
};

SHARDOPT_API const char* algorithm_name(Algorithm algorithm);
SHARDOPT_API const char* state_precision_name(StatePrecision precision);
SHARDOPT_API const char* master_storage_name(MasterStorage master);

// Muon's adjust_lr_fn: none and original scale lr by sqrt(max(1, rows/cols)); match_rms_adamw
// by 0.2 * sqrt(max(rows, cols)); spectral_unclamped by sqrt(rows/cols) (torch.optim.Muon's
// _adjust_lr).
enum class MuonLrAdjust : int32_t { none = 0, original = 1, match_rms_adamw = 2, spectral_unclamped = 3 };
SHARDOPT_API const char* muon_lr_adjust_name(MuonLrAdjust adjust);
// The arithmetic of Muon's Newton-Schulz products (OptimizerConfig::muon.precision).
//  bf16: as torch.optim.Muon, whose orthogonalisation runs on a bfloat16 copy: every operand
//        and every product's result is rounded to bf16 (nearest even); each product is an fp32
//        GEMM of those bf16 values (fp32 accumulation), its epilogue (beta*C + alpha*AB) in
//        fp32, then rounded once to bf16. The normalisation divides by the Frobenius norm
//        (accumulated in fp32, rounded to bf16, floored at eps), each quotient rounded to bf16.
//  f32:  the same steps in fp32, nothing rounded to bf16.
enum class MatrixPrecision : int32_t { bf16 = 0, f32 = 1 };
SHARDOPT_API const char* overlap_policy_name(OverlapPolicy policy);
SHARDOPT_API const char* partition_name(PartitionStrategy partition);

// Per-group hyperparameters, with torch.optim's names. Changeable between steps; every rank
// must hold the same values when it steps (checked at each step, Error(mismatch) otherwise).
// A default-constructed Hyperparams holds torch's Adam/SGD defaults; default_hyperparams()
// gives each algorithm's own (AdamW's weight_decay is 1e-2).
struct Hyperparams {
  double lr = 1e-3;
  double beta1 = 0.9;   // Adam/AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // SGD/Adam: L2 added to the gradient; AdamW: decoupled
  double momentum = 0.0;      // SGD
  double dampening = 0.0;
  bool nesterov = false;
  bool maximize = false;
  bool amsgrad = false;
  // Muon (torch.optim.Muon's names; Muon also reads lr, weight_decay (decoupled), momentum,
  // nesterov and eps, the Newton-Schulz normaliser's floor).
  std::array<double, 3> ns_coefficients{3.4445, -4.775, 2.0315};
  int32_t ns_steps = 5;
  MuonLrAdjust adjust_lr_fn = MuonLrAdjust::none;
};

// torch.optim's constructor defaults for `algorithm` (SGD and Adam: Hyperparams{}; AdamW:
// weight_decay 1e-2; Muon: weight_decay 0.1, momentum 0.95, nesterov, eps 1e-7).
SHARDOPT_API Hyperparams default_hyperparams(Algorithm algorithm);

// The hyperparameters a param group sets itself, as the keys of one of torch's param-group
// dicts: a field left unset takes the optimizer's defaults (OptimizerConfig::defaults), at
// construction and in add_param_group. A full Hyperparams converts to one with every field set.
struct GroupHyperparams {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  std::optional<bool> nesterov, maximize, amsgrad;

  std::optional<std::array<double, 3>> ns_coefficients;
  std::optional<int32_t> ns_steps;
  std::optional<MuonLrAdjust> adjust_lr_fn;

  GroupHyperparams() = default;
  GroupHyperparams(const Hyperparams& all);  // NOLINT(google-explicit-constructor): every field set
  // The set fields over `defaults`.
  Hyperparams resolve(const Hyperparams& defaults) const;
};

// Dynamic loss scaling for f16 gradients, with torch.cuda.amp.GradScaler's parameters and rules:
// a step whose gradients hold an inf or NaN on any rank is skipped on every rank (no param,
// state or step-count change) and the scale is multiplied by backoff_factor (never below
// min_scale); after growth_interval clean steps in a row it is multiplied by growth_factor.
struct LossScaling {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
};

// Muon's orthogonalisation, for every Muon group of an optimizer.
struct MuonSettings {
  MatrixPrecision precision = MatrixPrecision::bf16;
  // Threads of each BLAS product on the CPU (OpenBLAS). Fixed here, not taken from the
  // machine, so the bits never depend on the thread count a process happens to get; every rank
  // must use the same value (it is agreed like the rest of the config).
  int blas_threads = 1;
};

struct OptimizerConfig {
  // Every group's algorithm unless the group names its own (GroupSettings::algorithm).
  Algorithm algorithm = Algorithm::adam;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  // false: every rank keeps the full optimizer state and updates every parameter (the
  // unsharded data-parallel baseline); no parameter sync is needed.
  bool shard_state = true;
  // Largest single collective issued by reduce_gradients() and the parameter sync. 4 MiB by
  // measurement (bench/MEASURED.md): over Open MPI's shared-memory path, averaging the tutorial
  // model's 320 MB of gradients at 2 ranks took 187 ms in 4 MiB buckets, 185 ms in 1 MiB and
  // 432 ms in 64 MiB ones. A bucket holds at least 16 elements; a bucket_bytes that would cut
  // the parameters (all of them, trainable or not) into more than 2^24 buckets is refused at
  // registration (Error(invalid_argument) naming the least bucket_bytes that fits).
  int64_t bucket_bytes = int64_t{4} << 20;
  // Threads for the CPU update (OpenMP); 0 leaves the OpenMP default.
  int cpu_threads = 0;
  // > 0 (bucket view, sharded): the step updates the shard in chunks of this many bytes and
  // starts each chunk's sync (broadcasts from its owner) while the next chunk is updated.
  // 0: update everything, then one all-gather (flat) or the bucketed broadcasts.
  int64_t pipeline_chunk_bytes = 0;
  // Bucket view, CPU parameters, sharded, nodes of several ranks: the ranks of a node map one
  // parameter buffer (one copy of the parameters per node, not per rank); each rank updates its
  // shard in place, so the sync within a node is a barrier, and between nodes each shard
  // travels once per node. Results are bitwise those of false. Where a node cannot share memory
  // (e.g. /dev/shm too small) every rank falls back to a buffer of its own: memory_report()
  // tells which. Since the node's ranks see one buffer, a write through param_view() on one
  // rank is seen by the others: give every rank the same initial values (as data parallelism
  // requires; at registration each rank's shard takes its own rank's values, parameters of
  // other nodes' shards and frozen ones the node's first rank's), and write between collective
  // calls. pipeline_chunk_bytes does not apply (there is no copy to overlap on a node).
  // External storage keeps the caller's buffers per rank; there the sync's staging buffer is
  // node-shared, so the sync on a node is two memory copies and a barrier.
  // With every rank on one node the gradient average goes through node-shared memory too
  // (bucket view, stage 1 and 2: the gradient buffers are a slot per rank, grad_view() at both
  // stages; external storage: the gradients are copied into a slot per rank of trainable_numel,
  // counted in memory_report().buffer_bytes), bitwise as through MPI; with config.overlap each
  // bucket is summed over the slots once every rank of the node has handed it over.
  bool node_shared_params = true;
  // 1: ZeRO-1, gradients are averaged whole on every rank (all-reduce). 2: ZeRO-2, each rank
  // receives only its shard's averaged gradients (bucketed reduce-scatter to the owners) and
  // keeps gradient memory for its shard only; see reduce_gradient().
  int stage = 1;
  // bf16/f16 parameters: how the updated fp32 master is written back into the parameter.
  // false: round to nearest even. true: stochastic rounding, drawn from a counter-based hash of
  // (rounding_seed, step, element), so a run is reproducible and independent of the world size.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
  // The groups' defaults for GroupSettings (each group may set its own).
  StatePrecision state_precision = StatePrecision::fp32;
  // remainder16 needs bf16 parameters on the CPU and nearest rounding (stochastic_rounding
  // draws the parameter independently of the master, so no remainder could reconstruct it):
  // anything else is refused at registration with Error(invalid_argument) naming the group.
  MasterStorage master = MasterStorage::fp32;
  LossScaling loss_scaling;
  // Join (uneven inputs): while some ranks are in join(), the averaged gradients are the sum
  // over the ranks still active divided by their number (false), or by the world size (true,
  // as DDP's divide_by_initial_world_size). Without joined ranks both divide by the world size.
  bool divide_by_initial_world_size = false;
  // Overlapping the gradient reduction with backward and the parameter all-gather with the
  // next forward (torch ZeRO's overlap_with_ddp, Megatron's overlapped distributed optimizer).
  // Not off, CPU parameters: the optimizer's communicator calls all run on a communication
  // thread of its own, one at a time and in the order they were issued (MPI must provide
  // MPI_THREAD_SERIALIZED; Error(unsupported) naming the level it provides otherwise), so
  // collectives progress while the trainer computes. CUDA parameters over NCCL: no thread; the
  // collectives are enqueued on the communication stream (nccl_stream) in the order issued and
  // progress there while the trainer's kernels run, ordered against cuda_stream() by events
  // created once per layout. No bucket makes the host wait (see wait_param); the host waits
  // only in the small agreements a round opens and ends with, which queue on the communication
  // stream behind the collectives issued before them (the round's reductions; at the first
  // hand-over, the last step's gathers). CUDA parameters over MPI: one rank (no collective)
  // works alike; over several ranks (a CUDA-aware MPI) registration raises Error(unsupported)
  // on every rank. Hand gradients over as backward produces them (grad_ready for
  // gradients written into grad_view at stage 1 or, on one node's slots, at stage 2;
  // reduce_gradient at either stage); each
  // bucket (bucket_bytes of the layout) is reduced once all of it is in. The first round's
  // order of completed buckets is agreed across the ranks (Error(mismatch) naming both orders
  // otherwise) and kept: later rounds issue buckets in that order, and step() issues the
  // all-gathers in its reverse (forward order). reduce_gradients() ends each round (and still
  // checks that every rank completed the buckets in the same order); with per_bucket, whose
  // buckets are updated by then, only step() may follow it: any other collective call (save,
  // save_async, load, state dicts, set_trainable, add_param_group, join) raises
  // Error(invalid_argument) on every rank and changes nothing. After step() returns,
  // wait_param/wait_bucket/wait_all before reading a parameter. Do not call the communicator
  // directly, or through another object built on it (another optimizer, an averager), until
  // wait_all(): those calls would race the optimizer's queued ones. Every collective call of
  // this optimizer (and its destructor) first lets the queued work finish. Storage::external is
  // refused (Error(invalid_argument)). On a device, write or hand gradients in order on
  // cuda_stream() as without overlap; per_bucket updates each bucket on cuda_stream() behind its
  // reduction, so backward work enqueued on cuda_stream() after a hand-over waits for it (run
  // backward on a stream of your own, ordered before cuda_stream() at each hand-over, to keep
  // computing meanwhile).
  OverlapPolicy overlap = OverlapPolicy::off;
  // The optimizer-level hyperparameters (torch's `defaults`): what a group's unset fields take,
  // at construction and in add_param_group. Unset: default_hyperparams(the group's algorithm).
  std::optional<Hyperparams> defaults;
  MuonSettings muon;
};
// Every field of OptimizerConfig must be the same on every rank except cpu_threads (a local
// tuning that never changes results); the constructor checks, raising Error(mismatch) on every
// rank naming the field, its values and the ranks.

// Parameters live on the CPU or on one CUDA device (Device::cuda(i)), the same for all of an
// optimizer's parameters: with a nccl communicator its device(); with the MPI communicator any
// one device, which over several ranks needs a CUDA-aware MPI (checked at registration). On a
// CUDA device the flat buffers, the state and all staging live on that device, and the update,
// copies and collectives run on cuda_stream(), asynchronously to the host.
struct ParamSpec {
  std::string name;
  // external: the caller's parameter buffer. bucket_view: optional initial values (data may
  // be null for zeros); numel, dtype and device describe the parameter either way.
  TensorRef param;
  // external: the caller's gradient buffer (same numel/dtype/device as param).
  // bucket_view: leave data null; shardopt owns the gradient (see grad_view).
  TensorRef grad;
  // The parameter's shape, row-major; empty: 1-D of param.numel elements. Muon needs it (its
  // groups take 2-D parameters only, whose product must be numel); the other algorithms
  // ignore it beyond that check. Must agree across ranks.
  std::vector<int64_t> shape{};
};

// Per-group settings fixed for the group's life (unlike Hyperparams, they decide how the
// group's state is laid out). Unset: the OptimizerConfig's value. Every rank must pass the same
// (Error(mismatch) naming the group and field otherwise); checkpoints record them.
struct GroupSettings {
  std::optional<Algorithm> algorithm;  // fixed for the group's life; unset: OptimizerConfig's value
  std::optional<StatePrecision> state_precision;
  std::optional<MasterStorage> master;
};

struct ParamGroupSpec {
  std::vector<ParamSpec> params;
  GroupHyperparams hyper;  // unset fields: the optimizer's defaults
  GroupSettings settings{};
};

using ParamId = int32_t;  // registration order across all groups, as torch's global index

// Bytes this rank holds, per component. The ZeRO paper's per-parameter formulas (bf16 params,
// Adam): stage 1 = params 2 + grads 2 + (master 4 + state 8)/N; stage 2 = 2 + (2 + 12)/N.
struct MemoryReport {
  int64_t state_bytes = 0;         // optimizer state (exp_avg, exp_avg_sq, momentum, ...)
  int64_t master_bytes = 0;        // masters of this rank's shard (bf16/f16 params): 4 bytes per
                                   // element (fp32) or 2 (remainder16)
  int64_t param_bytes = 0;         // parameters shardopt owns for this rank alone (bucket view)
  // node_shared_params: the parameter buffer this rank maps with the other node_ranks - 1
  // ranks of its node, one copy per node (bucket view: param_bytes is then 0; external storage:
  // the sync's staging, otherwise in buffer_bytes).
  int64_t node_shared_param_bytes = 0;
  int32_t node_ranks = 1;
  // Gradients shardopt owns. Stage 2: this rank's shard only; on one node with node-shared
  // parameters, this rank's whole node-shared gradient slot, into whose shard positions the
  // shard's average is summed.
  int64_t grad_bytes = 0;
  int64_t buffer_bytes = 0;        // staging for the sync and the gradient reduction
  int64_t shard_numel = 0;         // elements this rank updates
  int64_t trainable_numel = 0;     // trainable elements over all ranks
};

// What the last step() did.
struct StepReport {
  bool skipped = false;          // loss scaling found an inf/NaN gradient on some rank
  double loss_scale = 1.0;       // the scale the step's gradients carried (1 without scaling)
  double grad_norm = -1.0;       // total norm from clip_grad_norm() before this step; -1 if none
  double clip_coef = 1.0;        // factor applied to the (unscaled) gradients by clipping
  int64_t skipped_steps = 0;     // skipped steps since construction
  // Wall time of the step's phases on this rank, in seconds: the agreement at its start (which
  // also waits for the slowest rank to arrive), the update kernels, and the parameter sync
  // (pipelined: whatever of update_and_sync was not update). Their sum is the step's time but
  // for bookkeeping of microseconds. On a CUDA device the update and sync are only enqueued,
  // so these are host times.
  double agree_seconds = 0.0;
  double update_seconds = 0.0;
  double sync_seconds = 0.0;
  // Of update_seconds, the part spent in Muon's Newton-Schulz orthogonalisations (0 without
  // Muon groups or on a CUDA device).
  double newton_schulz_seconds = 0.0;
};

// Every collective call (the constructor, add_param_group, set_trainable, reduce_gradients,
// clip_grad_norm, step, the first grad_ready/reduce_gradient of an overlapped round, save, save_async, wait_save with a save pending, load,
// consolidate_state_dict, load_state_dict) starts with one small agreement among the ranks:
// ranks in different calls, with different arguments or hyperparameters, or with an invalid
// value on any one of them all raise the same Error on every rank (mismatch, naming the
// operation or field, the values and the ranks; or the invalid value's own error) instead of
// hanging or diverging. Getters never communicate.
class SHARDOPT_API ZeroOptimizer {
 public:
  // Collective over `comm`: every rank must pass the same config and register the same params
  // (names, numels, dtypes, groups, hyperparameters) in the same order; a mismatch raises
  // Error(mismatch) naming the first differing config field or parameter on every rank.
  // Params before config, as torch's optimizers and shardopt.ZeroOptimizer in Python take them.
  ZeroOptimizer(std::shared_ptr<Communicator> comm, std::vector<ParamGroupSpec> groups,
                OptimizerConfig config = {});
  // The earlier order (config before groups), kept for existing callers; the same optimizer.
  // The C ABI's shardopt_optimizer_create keeps this order too.
  ZeroOptimizer(std::shared_ptr<Communicator> comm, OptimizerConfig config,
                std::vector<ParamGroupSpec> groups);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Collective. Earlier params keep their ids, state and (sorted_greedy) owners. The group's
  // unset hyperparameters take the optimizer's defaults().
  int add_param_group(ParamGroupSpec group);
  // Collective: the same call on every rank. Frozen params are not updated and hold no state.
  // The layout is rebuilt here (bucket views move: call param_view/grad_view again).
  void set_trainable(ParamId id, bool trainable);
  bool trainable(ParamId id) const;

  int num_groups() const;
  int num_params() const;
  // A group's hyperparameters, to read or change between steps. The reference stays valid for
  // the optimizer's lifetime (add_param_group does not move earlier groups).
  Hyperparams& hyperparams(int group);
  const Hyperparams& hyperparams(int group) const;
  // The optimizer-level defaults (torch's `defaults`).
  const Hyperparams& defaults() const;
  // A group's algorithm (GroupSettings::algorithm, or config.algorithm), fixed for its life.
  Algorithm group_algorithm(int group) const;
  // A parameter's shape as registered (empty: 1-D).
  const std::vector<int64_t>& param_shape(ParamId id) const;
  ParamId find_param(const std::string& name) const;  // Error(invalid_argument) if absent
  const std::string& param_name(ParamId id) const;
  int param_group(ParamId id) const;
  int64_t param_step(ParamId id) const;  // optimizer steps this param has taken
  // Rank a param is assigned to: sorted_greedy (torch's assignment, frozen params included;
  // a frozen param is never updated); flat: the rank holding all of it, -1 if it straddles
  // ranks or is frozen; -1 without sharding.
  int param_owner(ParamId id) const;

  // bucket_view: views into shardopt's flat buffers; external: the caller's buffers.
  // grad_view at stage 2 with bucket view: only with node_shared_params (several ranks) on one
  // node, or without config.overlap on nodes of equal size (the hierarchical reduction), where
  // the view is this rank's node-shared gradient slot (write the backward's
  // gradients there and call reduce_gradients(), or grad_ready(id) with config.overlap: no
  // hand-over copy); refused elsewhere.
  TensorRef param_view(ParamId id) const;
  TensorRef grad_view(ParamId id) const;
  // Shared ownership of the memory behind param_view(id) / grad_view(id), pointing at the
  // view's first element. While a holder keeps it, that memory stays allocated (a node-shared
  // buffer: mapped), also after a layout change (set_trainable, add_param_group, a load) has
  // moved the views elsewhere or the optimizer is gone: a kept view then reads the values of
  // the moment of the change and is no longer the parameter (fetch a new view). For bindings
  // that hand views out (Python arrays, DLPack exports). External storage: empty (the buffers
  // are the caller's). grad_view_owner refuses what grad_view refuses.
  std::shared_ptr<const void> param_view_owner(ParamId id) const;
  std::shared_ptr<const void> grad_view_owner(ParamId id) const;
  uint64_t layout_version() const;  // bumps whenever views may have moved (collective calls only)

  void zero_grad();
  // Averages gradients over the ranks, for trainers without their own DDP. Stage 1: a bucketed
  // all-reduce of every gradient. Stage 2: each rank receives only its shard's average
  // (bucketed reduce-scatter); external storage reads the caller's gradient buffers, bucket
  // view takes the gradients handed to reduce_gradient() since the last step and checks that
  // every trainable parameter was handed (or, where stage 2 has grad views, none: then the
  // gradients are read in place from grad_view, as at stage 1).
  void reduce_gradients();
  // Stage 2, bucket view: hands this rank's local gradient of one parameter (as a backward hook
  // would). Collective per bucket: every rank must hand the same parameters in the same order,
  // once per step; a bucket is reduced to its owners as soon as all its parameters are in, so
  // only the shard's gradients (plus in-flight buckets) are kept. On one node with
  // node_shared_params the gradient is copied into this rank's node-shared slot instead (no copy
  // when `grad` is grad_view(id) itself), and reduce_gradients() sums each shard over the node's
  // slots (no bucket is reduced early). `grad` is read before the
  // call returns on the CPU; on a device, in order on cuda_stream() (see there). Error(invalid_argument) for a wrong numel/dtype/device or a second hand-over.
  // With config.overlap, also at stage 1 (the gradient is copied into grad_view(id)).
  void reduce_gradient(ParamId id, const TensorRef& grad);
  // Stage 1, bucket view (stage 2 where it has grad views): param `id`'s gradient in
  // grad_view(id) is final for this round. With
  // config.overlap its bucket's reduction starts once the whole bucket is ready; without, the
  // call only checks `id` (reduce_gradients() reads every gradient). Collective per bucket
  // like reduce_gradient.
  void grad_ready(ParamId id);
  // config.overlap: return once the values of param `id` (or of bucket `bucket`, numbered by
  // position in the layout, 0 .. num_buckets()-1) of the last step have landed on this rank;
  // wait_all() for all of them. Local (no collective); rethrow the failure of a collective
  // they waited for. Without overlap they return at once (step() syncs before it returns).
  // CUDA parameters: they do not block the host; they make cuda_stream() wait (on the device)
  // for the gathers of those values, so work enqueued on cuda_stream() afterwards (the next
  // forward, or a copy, followed by a wait on that stream where the host reads) sees them.
  // Work on another stream must wait for cuda_stream() after the call (an event recorded on
  // it) to be ordered after them. A failed or missing peer surfaces as Error(timeout)/(comm)
  // at the next call that waits on the host.
  void wait_param(ParamId id);
  void wait_bucket(int bucket);
  void wait_all();
  int num_buckets() const;
  // Collective. Total norm (norm_type 2 or inf) of the averaged, unscaled gradients over all
  // ranks' shards, as torch.nn.utils.clip_grad_norm_ returns it; the factor
  // max_norm / (norm + 1e-6), capped at 1, is applied inside the next step()'s update (no
  // extra pass over the gradients, which keep their values). Call after reduce_gradients().
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // Loss scaling: the factor to multiply the loss by before backward (1 when disabled).
  double loss_scale() const;
  void set_loss_scale(double scale);  // e.g. when resuming; resets the growth count
  const StepReport& last_step() const;
  // Updates this rank's shard, then syncs parameters so every rank holds the same values.
  void step();
  // Calls `closure` (which recomputes loss and gradients) first, then steps; returns its loss.
  double step(const std::function<double()>& closure);
  // step(), except that the params in `without_grad` are left as they are: no update, no state
  // or step-count change (torch's optimizers skip a param whose .grad is None). Every rank must
  // name the same params; their gradient buffers are not read by the update.
  void step(const std::vector<ParamId>& without_grad);

  // ---- Join: uneven inputs (torch's Join context and ZeroRedundancyOptimizer.join_hook) ----
  // Collective, for a rank that has run out of inputs while others go on: until every rank has
  // called join(), this rank follows the calls of the ranks still active and takes its part in
  // them, so they can go on without it:
  //  - reduce_gradients / reduce_gradient: it contributes zero gradients (its own buffers, or
  //    with external storage the caller's registered gradient buffers, are zeroed), and the
  //    average divides the sum by the number of ranks that contributed (or the world size with
  //    config.divide_by_initial_world_size). At stage 2 with bucket view, while a rank is
  //    joined the buckets are reduced when the round finishes, in bucket order, not as they
  //    complete (every rank must issue them alike), which holds a whole gradient's staging.
  //  - clip_grad_norm: its shard's gradient statistics.
  //  - step: the same update of its own shard and the sync, with its own hyperparameters, loss
  //    scale and layout, which must equal the active ranks' (Error(mismatch) on every rank
  //    otherwise: do not change them until every rank has left join()).
  // Any other collective call while a rank is in join() raises Error(invalid_argument) on every
  // rank, naming the call and the joined rank. Who is active rides on each call's agreement
  // record, so joining costs no collective of its own; at stage 2 with bucket view each round
  // opens with one small agreement (at its first reduce_gradient) so that a joined rank can
  // take part before any bucket is reduced. Returns once every rank is in join(); afterwards
  // every rank holds the same parameters. Call it with no stage-2 round open. Refused while a
  // ModelAverager or PostLocalSGDOptimizer wraps this optimizer: Error(unsupported) on every
  // rank of the averaging's world (shardopt/averaging.hpp says where each rank raises it).
  void join();
  // One part of join(): follows the active ranks' calls up to and including one step (true), or
  // returns false once every rank is in join_step()/join(). For trainers whose own join loop
  // calls a hook once per iteration (torch's Join).
  bool join_step();

  MemoryReport memory_report() const;

  // CUDA parameters: the cudaStream_t (as void*) of this optimizer's compute work (updates,
  // copies, fills): a stream of its own; null for CPU parameters. With NCCL the collectives run
  // on nccl_stream(communicator()) and are ordered against this stream on the device by events,
  // so step() and reduce_gradient() return without waiting for the device. Write gradients on
  // this stream (or synchronise yours first) before reduce_gradient(s)()/step(), reuse a buffer
  // handed to reduce_gradient() only in work enqueued on it afterwards, and order reads of
  // param_view() after step() against it.
  void* cuda_stream() const;

  // ---- checkpoints (src/checkpoint/; types in shardopt/checkpoint.hpp) ----
  // Collective. Every rank writes its shard file into `dir` (created if needed), then rank 0
  // writes manifest.json last, atomically: a save that fails or crashes midway leaves the
  // previous checkpoint in `dir` loadable; files of older saves are removed afterwards.
  void save(const std::string& dir);
  // Collective: the same checkpoint as save(dir) at this point of training, written while
  // training goes on. This rank's shard file is written by a background thread straight from
  // the optimizer's buffers (no copy of the state is made; bf16/f16 values pass through a 4 MiB
  // chunk); step(), load_state_dict(), set_trainable(), add_param_group() and the averagers
  // first wait until the writer has read them (handed to the OS, not yet on disk). Do not write
  // parameter values yourself (param_view, external buffers) before the next step() returns.
  // The checkpoint is committed (rank 0's manifest) only by wait_save(); until then the
  // previous checkpoint in `dir` is the one a load finds, and a crash or kill at any point
  // leaves it intact. save_async, save and load first complete a pending background save as
  // wait_save() does; destroying the optimizer with one pending abandons it (no manifest).
  void save_async(const std::string& dir);
  // Collective: waits for the pending save_async (none: returns at once), then the ranks agree
  // on their files and rank 0 proves and commits the checkpoint, as save() does. A failure on
  // any rank (an unwritable file, a full disk) raises the same Error as save() on every rank,
  // the previous checkpoint intact; the save is no longer pending either way.
  void wait_save();
  // Collective. Validates the checkpoint (format version, same params and groups as
  // registered, every file present with its size and checksum) before changing anything,
  // raising the same Error on every rank; then restores state, steps, hyperparameters,
  // trainable flags and parameter values, resharding when the world size or partition differ.
  void load(const std::string& dir);
  // Collective: gathers every rank's share of the state on rank `to` (torch's semantics).
  void consolidate_state_dict(int to = 0);
  // The state consolidated on this rank by the last consolidate_state_dict(), with the current
  // param groups; Error(invalid_argument) on a rank that holds none. (`struct StateDict`
  // declares shardopt::StateDict, defined in checkpoint.hpp, so this header needs no include.)
  struct StateDict state_dict() const;
  // Each rank keeps only its share of `state` (call on every rank with the same dict).
  void load_state_dict(const struct StateDict& state);
  // ---- end of checkpoints ----

  Communicator& communicator() const;
  const OptimizerConfig& config() const;

  // The internals, defined inside the library (opaque here; named so its modules can pass it).
  struct Impl;
  // The library's other modules (model averaging) reach the internals through this.
  friend Impl& optimizer_internals(ZeroOptimizer& optimizer);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardopt
