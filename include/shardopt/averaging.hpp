// shardopt/averaging.hpp — model averaging across replicas: torch's PeriodicModelAverager, HierarchicalModelAverager and PostLocalSGDOptimizer, with an optional outer optimizer (DiLoCo).
//
// Local SGD keeps several replicas of the model that train apart and meet now and then. Here a
// replica is one ZeroOptimizer: its ranks (its communicator, the "local group") average their
// gradients every step and keep one model, its state sharded among them (ZeRO inside a node).
// The replicas are the local groups of a larger "world" communicator; every `period` steps
// their parameters are averaged over the world (or, hierarchically, over groups of replicas).
// Since the ranks of a replica hold the same parameters, each averages only its own shard with
// the matching ranks of the other replicas, then the replica's parameter sync spreads it: a
// rank sends 1/L of the model across the slow links (L: ranks per replica), torch sends all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/export.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {

// Every `period` steps (after warmup) the replicas in each group of `group_size` consecutive
// world ranks average their parameters (torch: dist.new_subgroups(group_size)). group_size 0
// stands for the whole world.
struct AveragingLevel {
  int64_t period = 1;
  int group_size = 0;
};

// Instead of taking the plain average, the world-level averaging can apply an outer optimizer
// (DiLoCo): the average change of the replicas since the last world-level sync is a
// pseudo-gradient, (params at the last sync) - (average of the replicas' params), applied to the
// params of the last sync by torch's SGD with these settings (dampening 0, no weight decay);
// every replica then continues from the result. Each rank keeps the last sync's values and the
// momentum for its own shard only, as f32, sharded like the optimizer's state.
// Where a local phase starts other than at a sync (construction, the end of warmup, set_step, the
// optimizer's parameters replaced by load/load_state_dict or a layout change), the outer
// optimizer starts afresh (momentum zero) from the parameters as they are when it starts:
// PostLocalSGDOptimizer takes them when its next round begins, so weights written through
// param_view after construction or set_step count. A ModelAverager on its own never sees a step
// begin: it takes them at construction, set_step and the end of warmup, and when the parameters
// were replaced (load, load_state_dict, layout change) after that, its next world-level
// averaging is a plain average the outer optimizer restarts from.
struct OuterOptimizer {
  bool enabled = false;
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
};

struct AveragerConfig {
  // Increasing periods with increasing group sizes; the last level's group is the world. A
  // step that several periods divide averages at the level of the largest of them only (torch).
  // One level {period, 0} is torch's PeriodicModelAverager.
  std::vector<AveragingLevel> levels;
  // Averaging starts at this step. PeriodicModelAverager counts its periods from here
  // ((step - warmup) % period == 0), HierarchicalModelAverager from step 0 (step % period == 0),
  // as torch does: `hierarchical` selects the second rule. PostLocalSGDOptimizer averages
  // gradients over the world, not the local group, during warmup.
  int64_t warmup_steps = 0;
  bool hierarchical = false;
  // Largest single collective of the averaging (f32, bf16 or f16 elements).
  int64_t bucket_bytes = int64_t{4} << 20;
  OuterOptimizer outer;
};

// torch's PeriodicModelAverager(period, warmup_steps) and
// HierarchicalModelAverager({period: group_size, ...}, warmup_steps).
SHARDOPT_API AveragerConfig periodic_averager(int64_t period, int64_t warmup_steps = 0);
SHARDOPT_API AveragerConfig hierarchical_averager(std::vector<AveragingLevel> levels, int64_t warmup_steps = 0);

// What a rank has handed to collectives that span more than one rank, in bytes of payload.
struct CommunicationCounts {
  // Gradient averaging (PostLocalSGDOptimizer only): across the replicas in warmup, plus the
  // replica's own reduction when it has several ranks.
  int64_t gradient_bytes = 0;
  int64_t averaging_bytes = 0;  // parameter averaging (and the outer optimizer's)
  // average_parameters() calls on an averaging step, a level whose groups hold one replica
  // (which sends nothing) included.
  int64_t averages = 0;
};

// Averages the parameters of one replica with the other replicas. Construction is collective
// over `world`. Validation follows torch (Error(invalid_argument) with torch's wording): levels
// not empty, periods positive, warmup_steps >= 0, each group size positive, at most the world
// size and dividing it, the last one the world size; beyond torch: periods and group sizes
// strictly increasing, each group size a multiple of the replica's size, and every replica
// inside one group of every level. The replicas must be local groups of `world`: the
// optimizer's communicator groups L ranks of `world`, every rank of `world` is in exactly one
// such group, all of size L, and their optimizers were registered alike (same params, dtype,
// partition, storage); mismatches raise Error(mismatch) on every rank. CPU parameters only.
//
// Join (uneven inputs) does not combine with averaging: while an averager wraps the optimizer,
// its join()/join_step() raise Error(unsupported) "Join does not combine with model averaging
// (rank R called join())" (R: the rank in `world`), and so does every other rank of `world`, in
// its next call that meets a rank that knows (a replica peer's next optimizer call; the other
// replicas' next warmup gradient averaging or average_parameters()), never as a timeout and with
// no parameter changed: the ranks that raise it carry it into the next agreement of their
// replica and averaging groups before they raise (docs/local_sgd.md). The replicas must reach
// that averaging within CommOptions::timeout_seconds, as for any averaging.
class SHARDOPT_API ModelAverager {
 public:
  ModelAverager(std::shared_ptr<Communicator> world, ZeroOptimizer& optimizer, AveragerConfig config);
  ~ModelAverager();
  ModelAverager(const ModelAverager&) = delete;
  ModelAverager& operator=(const ModelAverager&) = delete;

  // torch's average_parameters(): if this step averages, the replicas in each group of the
  // level it falls on average their trainable parameters (collective over those ranks); then
  // the step count advances. Call after the optimizer's step(), on every rank of the world.
  // Plain averaging divides each value by the number of replicas in the group and sums them, as
  // torch does; bf16/f16 parameters average their fp32 masters and round the result to the
  // parameter (to nearest even), so no precision is lost between averagings.
  void average_parameters();
  // The group size (in world ranks) the next average_parameters() averages over; 0 if none.
  int next_group_size() const;

  int64_t step() const;
  // As torch's `averager.step = n` (e.g. when resuming without a checkpoint). With the outer
  // optimizer, it restarts from the current parameters (see OuterOptimizer).
  void set_step(int64_t step);
  const AveragerConfig& config() const;
  const CommunicationCounts& communication() const;
  int replica_size() const;   // L: ranks per replica
  int num_replicas() const;   // world size / L

  // The internals, defined inside the library.
  struct Impl;

 private:
  friend class PostLocalSGDOptimizer;
  std::unique_ptr<Impl> impl_;
};

// torch's PostLocalSGDOptimizer state_dict: the wrapped optimizer's consolidated dict plus the
// averager's step ("step" in torch's dict), absent in a dict from a plain optimizer.
struct PostLocalSGDStateDict {
  StateDict optimizer;
  bool has_step = false;
  int64_t step = 0;
};

// torch's PostLocalSGDOptimizer(optim, averager) for a ZeroOptimizer, with the gradient
// averaging of torch's post_localSGD_hook built in: reduce_gradients() averages over the world
// during warmup and over the replica (the optimizer's communicator) after it; step() steps the
// optimizer, then averages the parameters. The optimizer's communicator is the replica: by
// default, the ranks of one node (`world->split_node()`); any split of `world` into groups of
// equal size works, down to one rank each (plain local SGD). The optimizer must outlive this.
class SHARDOPT_API PostLocalSGDOptimizer {
 public:
  PostLocalSGDOptimizer(std::shared_ptr<Communicator> world, ZeroOptimizer& optimizer, AveragerConfig averager);
  ~PostLocalSGDOptimizer();
  PostLocalSGDOptimizer(const PostLocalSGDOptimizer&) = delete;
  PostLocalSGDOptimizer& operator=(const PostLocalSGDOptimizer&) = delete;

  // As the optimizer's, with the averaging group above. During warmup with more than one
  // replica the gradients are first averaged across the replicas (each rank with the same rank
  // of the other replicas), then within the replica: the world's average in two stages.
  void reduce_gradients();
  void reduce_gradient(ParamId id, const TensorRef& grad);
  void step();
  double step(const std::function<double()>& closure);

  // Collective over the world. A directory holds one checkpoint per replica (each the
  // optimizer's own sharded checkpoint, reshardable within its replica) and the averager's
  // state, committed together by one record written last: a save that fails or crashes leaves
  // the previous one loadable. load() restores every replica, the averager's step and the outer
  // optimizer's state; it needs the same number of replicas and (with an outer optimizer) the
  // same replica size. The outer optimizer's files record the parameters and element ranges
  // they hold, so they load into an optimizer of another partition, or whose trainable flags
  // differ before the load (it takes the saved ones): each element goes where the loading
  // layout keeps it.
  void save(const std::string& dir);
  void load(const std::string& dir);

  // torch's state_dict semantics over the optimizer's consolidate_state_dict(to) (collective
  // within each replica): the dict of rank `to` of the replica, plus the averager's step. The
  // outer optimizer's state is not part of it (use save/load).
  void consolidate_state_dict(int to = 0);
  PostLocalSGDStateDict state_dict() const;
  // Loads the optimizer's part; without a step the averager restarts at step 0 and
  // load_warning() says so (torch warns "Loaded state dict does not contain a step counter
  // for an averager. Setting step counter to 0.").
  void load_state_dict(const PostLocalSGDStateDict& state);
  const std::string& load_warning() const;

  ZeroOptimizer& optimizer();
  ModelAverager& averager();
  Communicator& world() const;
  const CommunicationCounts& communication() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardopt
