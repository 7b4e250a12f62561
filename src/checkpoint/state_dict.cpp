// src/checkpoint/state_dict.cpp — torch-style consolidate_state_dict / state_dict / load_state_dict.

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_access.hpp"
#include "optim/hyperparams.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {
namespace {

template <typename ImplT>  // ZeroOptimizer::Impl, private to the class: deduced, never named
std::vector<ParamGroupState> current_groups(const ImplT& im) {
  std::vector<ParamGroupState> groups(im.groups.size());
  for (std::size_t g = 0; g < im.groups.size(); ++g) groups[g].hyper = im.groups[g];
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    groups[static_cast<std::size_t>(im.params[i].group)].params.push_back(static_cast<ParamId>(i));
  }
  return groups;
}

// torch keeps state only for params that have been stepped.
bool has_state(const optim::ParamRecord& p) { return p.trainable && p.step > 0; }

}  // namespace

void ZeroOptimizer::consolidate_state_dict(int to) {
  Impl& im = *impl_;
  checkpoint::require_host_state(im, "consolidate_state_dict");
  Communicator& comm = *im.comm;
  if (im.layout_dirty) im.rebuild_layout();
  // Ranks must agree on `to`, or the gather below would be meaningless.
  checkpoint::Outcome mine;
  mine.value0 = static_cast<uint64_t>(static_cast<int64_t>(to));
  if (to < 0 || to >= im.world()) {
    mine.fail(Error(ErrorCode::invalid_argument,
                    fmt::format("target rank {} is out of range (world size {})", to, im.world())));
  }
  for (const checkpoint::Outcome& o : checkpoint::agree_on_outcomes(comm, mine, "consolidate_state_dict")) {
    SHARDOPT_CHECK(o.value0 == mine.value0, mismatch,
                   "consolidate_state_dict: ranks passed different target ranks ({} here, {} elsewhere)", to,
                   static_cast<int64_t>(o.value0));
  }

  const bool target = im.rank() == to;
  const auto kinds = im.state_kinds_needed();
  StateDict dict;
  if (target) {
    dict.algorithm = im.config.algorithm;
    for (const optim::ParamRecord& p : im.params) dict.param_names.push_back(p.name);
    for (std::size_t i = 0; i < im.params.size(); ++i) {
      const optim::ParamRecord& p = im.params[i];
      if (!has_state(p)) continue;
      ParamState& s = dict.state[static_cast<ParamId>(i)];
      s.step = p.step;
      for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
        if (!kinds[k] || (k == optim::kMomentum && !p.has_momentum_buffer)) continue;
        s.tensors[optim::kStateNames[k]].assign(static_cast<std::size_t>(p.numel), 0.f);
      }
    }
  }
  // Copies the pieces of one shard's state array into the dict (target rank only).
  auto scatter = [&](const partition::RankShard& shard, std::size_t k, const float* source) {
    for (const partition::Segment& seg : shard.segments) {
      auto entry = dict.state.find(seg.param);
      if (seg.length == 0 || entry == dict.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(tensor->second.data() + seg.param_offset, source + seg.shard_offset,
                  static_cast<std::size_t>(seg.length) * sizeof(float));
    }
  };
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!kinds[k]) continue;
    if (!im.sharded()) {
      if (target && im.state[k].numel() == im.own_shard().numel) scatter(im.own_shard(), k, im.state[k].data());
      continue;
    }
    // One broadcast per rank shard; only the target keeps what arrives.
    for (int r = 0; r < im.world(); ++r) {
      const partition::RankShard& shard = im.layout.shards[static_cast<std::size_t>(r)];
      if (shard.numel == 0) continue;
      core::FlatBuffer buffer(shard.numel);
      if (r == im.rank() && im.state[k].numel() == shard.numel) {
        std::memcpy(buffer.data(), im.state[k].data(), static_cast<std::size_t>(buffer.bytes()));
      }
      comm.broadcast(buffer.data(), shard.numel, DType::f32, r);
      if (target) scatter(shard, k, buffer.data());
    }
  }
  // Only the target rank keeps the gathered state; the others drop any earlier one.
  if (target) impl_->consolidated_state = std::move(dict);
  else impl_->consolidated_state.reset();
}

StateDict ZeroOptimizer::state_dict() const {
  SHARDOPT_CHECK(impl_->consolidated_state.has_value(), invalid_argument,
                 "state_dict(): rank {} holds no consolidated state; call consolidate_state_dict(to) on every rank "
                 "first and state_dict() on rank `to`",
                 impl_->rank());
  StateDict dict = *impl_->consolidated_state;
  dict.param_groups = current_groups(*impl_);
  return dict;
}

void ZeroOptimizer::load_state_dict(const StateDict& sd) {
  Impl& im = *impl_;
  checkpoint::require_host_state(im, "load_state_dict");
  if (im.layout_dirty) im.rebuild_layout();
  // Everything is checked before anything changes.
  SHARDOPT_CHECK(sd.algorithm == im.config.algorithm, mismatch,
                 "load_state_dict: the state dict is of a {} optimizer; this one runs {}", algorithm_name(sd.algorithm),
                 algorithm_name(im.config.algorithm));
  SHARDOPT_CHECK(sd.param_names.size() == im.params.size(), mismatch,
                 "load_state_dict: the state dict names {} parameters, {} are registered", sd.param_names.size(),
                 im.params.size());
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    SHARDOPT_CHECK(sd.param_names[i] == im.params[i].name, mismatch,
                   "load_state_dict: parameter #{} is '{}' in the state dict but '{}' here", i, sd.param_names[i],
                   im.params[i].name);
  }
  SHARDOPT_CHECK(sd.param_groups.size() == im.groups.size(), mismatch,
                 "load_state_dict: the state dict has {} param groups, this optimizer {}", sd.param_groups.size(),
                 im.groups.size());
  const std::vector<ParamGroupState> groups_here = current_groups(im);
  std::vector<Hyperparams> hypers;
  for (std::size_t g = 0; g < sd.param_groups.size(); ++g) {
    SHARDOPT_CHECK(sd.param_groups[g].params == groups_here[g].params, mismatch,
                   "load_state_dict: param group {} holds other parameters in the state dict than here", g);
    optim::validate_hyperparams(sd.param_groups[g].hyper, im.config.algorithm, static_cast<int>(g));
    hypers.push_back(sd.param_groups[g].hyper);
  }
  const auto kinds = optim::state_kinds_needed(im.config.algorithm, im.dtype, hypers);
  for (const auto& [id, s] : sd.state) {
    SHARDOPT_CHECK(id >= 0 && static_cast<std::size_t>(id) < im.params.size(), invalid_argument,
                   "load_state_dict: state for parameter #{} which does not exist", id);
    const optim::ParamRecord& p = im.params[static_cast<std::size_t>(id)];
    SHARDOPT_CHECK(p.trainable, invalid_argument, "load_state_dict: state for frozen parameter '{}'", p.name);
    SHARDOPT_CHECK(s.step >= 0, invalid_argument, "load_state_dict: parameter '{}' has negative step {}", p.name, s.step);
    for (const auto& [kind, values] : s.tensors) {
      std::size_t k = 0;
      while (k < optim::kStateKinds && kind != optim::kStateNames[k]) ++k;
      SHARDOPT_CHECK(k < optim::kStateKinds && kinds[k], invalid_argument,
                     "load_state_dict: parameter '{}' has state '{}', which a {} optimizer with these groups does not keep",
                     p.name, kind, algorithm_name(im.config.algorithm));
      SHARDOPT_CHECK(static_cast<int64_t>(values.size()) == p.numel, invalid_argument,
                     "load_state_dict: '{}' of parameter '{}' has {} elements, the parameter {}", kind, p.name,
                     values.size(), p.numel);
    }
  }

  im.groups = hypers;
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    optim::ParamRecord& p = im.params[i];
    auto it = sd.state.find(static_cast<ParamId>(i));
    p.step = it == sd.state.end() ? 0 : it->second.step;
    p.has_momentum_buffer = it != sd.state.end() && it->second.tensors.count("momentum_buffer") > 0;
  }
  const partition::RankShard& shard = im.own_shard();
  im.state_in_use = kinds;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    im.state[k].resize(kinds[k] ? shard.numel : 0);  // zeros: state absent from the dict starts afresh
    if (!kinds[k]) continue;
    for (const partition::Segment& seg : shard.segments) {
      auto entry = sd.state.find(seg.param);
      if (seg.length == 0 || entry == sd.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(im.state[k].data() + seg.shard_offset, tensor->second.data() + seg.param_offset,
                  static_cast<std::size_t>(seg.length) * sizeof(float));
    }
  }
  im.build_runs();
}

}  // namespace shardopt
