// tests/matrix/matrix_program.cpp — the feature matrix's training program: a few steps of the combination's algorithm (AdamW, SGD, Adam, or Muon beside AdamW; the second group's state fp32, 8-bit or 8-bit with remainder masters) driven as a trainer drives each feature, with gradients that are functions of (step, rank, param).
#include "matrix_program.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>

#include "precision.hpp"  // kernels/: float -> bf16 (nearest even)
#include "shardopt/shardopt.hpp"

namespace shardopt_matrix {

using namespace shardopt;

namespace {

// Several buckets of 64 f32 (128 bf16) elements, some params spanning two; two groups.
const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};
constexpr std::size_t kFirstGroupSize = 3;
constexpr int64_t kExtraSize = 40;  // the param add_param_group adds
// With 8-bit state the second group also holds a param this large: q8 quantises params of
// kernels' kQ8MinNumel (4096) elements and more, and keeps fp32 moments for smaller ones.
constexpr int64_t kQ8Size = 4100;
constexpr int kBatches = 4;         // without Join; with it even ranks train 3, odd ones 5
constexpr int kFrozen = 3;          // the param set_trainable freezes after step 1, thaws after step 2
// Short: a rank left behind fails its peers in seconds instead of hanging the test.
constexpr double kTimeoutSeconds = 6;

// Small integers: every sum over ranks is exact in f32 and bf16 whatever order a collective adds
// in, so reductions of any shape give the same bits and the reference can be replayed.
float grad_value(int rank, int step, int param, int64_t element) {
  return static_cast<float>((rank * 7 + step * 3 + param * 5 + element) % 9 - 4);
}

float initial_value(int param, int64_t element) {
  return static_cast<float>((param * 13 + element * 7) % 17 - 8) * 0.0625f;
}

// Values in the combination's dtype (f32 or bf16), as bytes.
std::vector<uint8_t> as_dtype(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * dtype_size(dtype));
  if (dtype == DType::f32) {
    std::memcpy(out.data(), values.data(), out.size());
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = kernels::float_to_bf16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The params' initial values (kept alive for the run) and their specs.
struct Params {
  DType dtype;
  std::vector<std::vector<uint8_t>> initial;

  ParamSpec spec(const std::string& name, int index, int64_t numel) {
    std::vector<float> values(static_cast<std::size_t>(numel));
    for (int64_t e = 0; e < numel; ++e) values[static_cast<std::size_t>(e)] = initial_value(index, e);
    initial.push_back(as_dtype(values, dtype));
    ParamSpec p;
    p.name = name;
    p.param = TensorRef{initial.back().data(), numel, dtype};
    return p;
  }
};

bool compact_state(const Combination& c) { return !c.is("state", "fp32"); }

// amsgrad in Adam's groups, except one keeping 8-bit moments (max_exp_avg_sq has no 8-bit form).
Hyperparams group_hyperparams(double lr, const Combination& c, bool q8_group) {
  Hyperparams h;
  h.lr = lr;
  h.weight_decay = 0.02;
  if (c.is("algorithm", "sgd")) {
    h.momentum = 0.9;
  } else {
    h.amsgrad = !q8_group;
  }
  return h;
}

// The first group's matrix shapes under muon_mixed (kSizes' first three as rows x cols).
const std::vector<std::vector<int64_t>> kMatrixShapes = {{37, 1}, {8, 8}, {5, 1}};

AveragerConfig averager_config(const std::string& local_sgd) {
  if (local_sgd == "replicas2") return periodic_averager(2, 1);
  AveragerConfig config = periodic_averager(2, 0);
  config.outer.enabled = local_sgd == "outer";
  return config;
}

int ranks_per_node(const Combination& c, bool reference) {
  if (reference) return 0;
  if (c.is("nodes", "pairs")) return 2;  // nodes {0,1},{2,3} at np 4
  if (!c.is("nodes", "uneven")) return 0;
  return c.np == 3 ? 2 : 3;  // nodes {0,1},{2} at np 3; {0,1,2},{3} at np 4
}

OptimizerConfig optimizer_config(const Combination& c, bool reference) {
  OptimizerConfig config;
  config.algorithm = c.is("algorithm", "sgd") ? Algorithm::sgd : c.is("algorithm", "adam") ? Algorithm::adam
                                                                                          : Algorithm::adamw;
  config.bucket_bytes = 256;
  config.overlap = reference ? OverlapPolicy::off
                   : c.is("overlap", "after_backward") ? OverlapPolicy::after_backward
                   : c.is("overlap", "per_bucket")     ? OverlapPolicy::per_bucket
                                                       : OverlapPolicy::off;
  config.stage = reference ? 1 : std::stoi(c["stage"]);
  // 8-bit blocks stay whole on one rank only under sorted_greedy (flat is refused), so the
  // reference of a compact-state combination partitions that way.
  const bool sorted = reference ? compact_state(c) : c.is("partition", "sorted_greedy");
  config.partition = sorted ? PartitionStrategy::sorted_greedy : PartitionStrategy::flat;
  config.node_shared_params = !reference && !c.is("nodes", "off");
  return config;
}

// One training run: the trainer's side of every feature.
class Program {
 public:
  Program(const Combination& c, bool reference, std::string dir)
      : c_(c), reference_(reference), dir_(std::move(dir)) {
    params_.dtype = c.is("dtype", "bf16") ? DType::bf16 : DType::f32;
  }

  void run(RunResult& result) {
    phase_ = "construct.communicator";
    CommOptions options;
    options.timeout_seconds = kTimeoutSeconds;
    options.ranks_per_node = ranks_per_node(c_, reference_);
    world_ = mpi_world(options);
    rank_ = world_->rank();
    const bool local_sgd = !c_.is("local_sgd", "off");
    std::shared_ptr<Communicator> replica = world_;
    if (local_sgd) {
      const int replica_size = c_.is("local_sgd", "replicas2") ? 2 : 1;
      replica = world_->split(rank_ / replica_size, rank_);
    }
    const OptimizerConfig config = optimizer_config(c_, reference_);
    stage_ = config.stage;
    overlapped_ = config.overlap != OverlapPolicy::off;
    ParamGroupSpec first, second;
    first.hyper = group_hyperparams(0.01, c_, false);
    second.hyper = group_hyperparams(0.02, c_, compact_state(c_));
    if (compact_state(c_)) second.settings.state_precision = StatePrecision::q8;
    if (c_.is("state", "compact")) second.settings.master = MasterStorage::remainder16;
    const bool muon = c_.is("algorithm", "muon_mixed");
    if (muon) {
      // Muon's own defaults (momentum 0.95, nesterov) under the matrix's lr and decay.
      first.settings.algorithm = Algorithm::muon;
      first.hyper = GroupHyperparams{};
      first.hyper.lr = 0.01;
      first.hyper.weight_decay = 0.02;
    }
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      (i < kFirstGroupSize ? first : second).params.push_back(params_.spec("p" + std::to_string(i), static_cast<int>(i), kSizes[i]));
      if (muon && i < kFirstGroupSize) first.params.back().shape = kMatrixShapes[i];
      sizes_.push_back(kSizes[i]);
    }
    if (compact_state(c_)) {
      second.params.push_back(params_.spec("q8", static_cast<int>(sizes_.size()), kQ8Size));
      sizes_.push_back(kQ8Size);
    }
    phase_ = "construct.ZeroOptimizer";
    opt_ = std::make_unique<ZeroOptimizer>(replica, config, std::vector<ParamGroupSpec>{first, second});
    if (local_sgd) {
      phase_ = "construct.PostLocalSGDOptimizer";
      plsgd_ = std::make_unique<PostLocalSGDOptimizer>(world_, *opt_, averager_config(c_["local_sgd"]));
    }
    const std::vector<uint8_t> initial = read_params(result);

    const int batches = c_.is("join", "on") ? 3 + 2 * (rank_ % 2) : kBatches;
    for (int t = 0; t < batches; ++t) {
      if (c_.is("lr_change", "yes") && t == 2) {
        for (int g = 0; g < opt_->num_groups(); ++g) opt_->hyperparams(g).lr *= 0.5;
      }
      const std::string step = "step" + std::to_string(t);
      phase_ = step + ".hand_over";
      hand_over(t);
      phase_ = step + ".reduce_gradients";
      if (plsgd_) {
        plsgd_->reduce_gradients();
      } else {
        opt_->reduce_gradients();
      }
      phase_ = step + ".step";
      if (plsgd_) {
        plsgd_->step();
      } else {
        opt_->step();
      }
      if (t == 1) mid_op_begin();
      if (t == 2) mid_op_end();
    }
    if (c_.is("join", "on")) {
      phase_ = "join";
      opt_->join();
    }
    phase_ = "read_params";
    result.bytes = read_params(result);
    result.changed = result.bytes.size() != initial.size() ||
                     std::memcmp(result.bytes.data(), initial.data(), initial.size()) != 0;
    result.completed = true;
  }

  const std::string& phase() const { return phase_; }

 private:
  // This rank's gradients of step t, in backward order (the last param first), as a trainer's
  // backward hands them: stage 1 written into grad_view (grad_ready when overlapped), stage 2
  // through reduce_gradient (the post-local SGD optimizer's when there is one).
  void hand_over(int t) {
    for (ParamId id = opt_->num_params() - 1; id >= 0; --id) {
      if (!opt_->trainable(id)) continue;
      const int64_t numel = sizes_[static_cast<std::size_t>(id)];
      std::vector<float> values(static_cast<std::size_t>(numel));
      for (int64_t e = 0; e < numel; ++e) values[static_cast<std::size_t>(e)] = grad_value(rank_, t, id, e);
      std::vector<uint8_t> grad = as_dtype(values, params_.dtype);
      if (stage_ == 1) {
        const TensorRef view = opt_->grad_view(id);
        std::memcpy(view.data, grad.data(), grad.size());
        if (overlapped_) opt_->grad_ready(id);
      } else {
        const TensorRef ref{grad.data(), numel, params_.dtype};
        if (plsgd_) {
          plsgd_->reduce_gradient(id, ref);
        } else {
          opt_->reduce_gradient(id, ref);
        }
      }
    }
  }

  // After step 1 on every rank (before any rank joins).
  void mid_op_begin() {
    const std::string& op = c_["mid_op"];
    phase_ = "mid." + op;
    if (op == "save_load") {
      if (plsgd_) {
        plsgd_->save(dir_);
        plsgd_->load(dir_);
      } else {
        opt_->save(dir_);
        opt_->load(dir_);
      }
    } else if (op == "save_async") {
      // The post-local SGD optimizer has no save_async: each replica saves its own optimizer,
      // into a directory of its own.
      opt_->save_async(plsgd_ ? dir_ + "/replica" + std::to_string(rank_ / opt_->communicator().size()) : dir_);
    } else if (op == "consolidate") {
      if (plsgd_) {
        plsgd_->consolidate_state_dict(0);
        if (opt_->communicator().rank() == 0) check_state(plsgd_->state_dict().optimizer);
      } else {
        opt_->consolidate_state_dict(0);
        if (rank_ == 0) check_state(opt_->state_dict());
      }
    } else if (op == "set_trainable") {
      opt_->set_trainable(kFrozen, false);
    } else if (op == "add_param_group") {
      ParamGroupSpec extra;
      extra.params.push_back(params_.spec("extra", static_cast<int>(sizes_.size()), kExtraSize));
      extra.hyper.lr = 0.03;  // the other fields from the optimizer's defaults
      opt_->add_param_group(extra);
      sizes_.push_back(kExtraSize);
    } else if (op != "none") {
      throw std::runtime_error("unknown mid_op " + op);
    }
  }

  // After step 2 on every rank.
  void mid_op_end() {
    const std::string& op = c_["mid_op"];
    phase_ = "mid_end." + op;
    if (op == "save_async") opt_->wait_save();
    if (op == "set_trainable") opt_->set_trainable(kFrozen, true);
  }

  // The consolidated dict holds state for every param that has stepped.
  void check_state(const StateDict& dict) const {
    if (dict.state.size() != sizes_.size()) {
      throw std::runtime_error("state_dict() holds " + std::to_string(dict.state.size()) + " params' state, not " +
                               std::to_string(sizes_.size()));
    }
  }

  // Every param's bytes, each read after wait_param (forward order, as the next forward would).
  std::vector<uint8_t> read_params(RunResult& result) {
    std::vector<uint8_t> out;
    result.param_offset.clear();
    for (ParamId id = 0; id < opt_->num_params(); ++id) {
      opt_->wait_param(id);
      const TensorRef v = opt_->param_view(id);
      const auto* p = static_cast<const uint8_t*>(v.data);
      result.param_offset.push_back(static_cast<int64_t>(out.size()));
      out.insert(out.end(), p, p + v.nbytes());
    }
    return out;
  }

  const Combination& c_;
  const bool reference_;
  const std::string dir_;
  Params params_;
  std::vector<int64_t> sizes_;
  std::shared_ptr<Communicator> world_;
  int rank_ = 0;
  int stage_ = 1;
  bool overlapped_ = false;
  std::unique_ptr<ZeroOptimizer> opt_;
  std::unique_ptr<PostLocalSGDOptimizer> plsgd_;
  std::string phase_;
};

}  // namespace

RunResult run_program(const Combination& c, bool reference, const std::string& dir,
                      std::vector<std::shared_ptr<void>>& keep) {
  RunResult result;
  auto kept = std::make_shared<Program>(c, reference, dir);
  keep.push_back(kept);
  Program& program = *kept;
  try {
    program.run(result);
  } catch (const Error& e) {
    result.phase = program.phase();
    result.code = error_code_name(e.code());
    result.message = e.what();
  } catch (const std::exception& e) {
    result.phase = program.phase();
    result.code = "std::exception";
    result.message = e.what();
  }
  return result;
}

}  // namespace shardopt_matrix
