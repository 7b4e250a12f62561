// tests/remote/remote_reference.hpp — the local reference (a one-rank ZeroOptimizer per algorithm fed the summed pushes) and one trainer step of the schedule against a RemoteOptimizer.
#pragma once

#include <map>
#include <memory>

#include "remote_model.hpp"

namespace shardopt_test {

using shardopt::Algorithm;
using shardopt::Communicator;
using shardopt::OptimizerConfig;
using shardopt::ParamGroupSpec;
using shardopt::ParamId;
using shardopt::ParamSpec;
using shardopt::RemoteContext;
using shardopt::RemoteOptimizer;
using shardopt::RemoteParam;
using shardopt::RemoteStepHandle;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

// One ZeroOptimizer per algorithm over a one-rank communicator: the local reference.
class LocalReference {
 public:
  LocalReference(const std::shared_ptr<Communicator>& alone, const std::vector<RemoteModelParam>& model)
      : model_(model) {
    for (Algorithm algorithm : {Algorithm::adamw, Algorithm::sgd}) {
      ParamGroupSpec group;
      group.hyper = busy_hyperparams(algorithm);
      for (const RemoteModelParam& p : model) {
        if (p.algorithm != algorithm) continue;
        where_[p.name] = {algorithm, static_cast<ParamId>(group.params.size())};
        group.params.push_back(ParamSpec{p.name, TensorRef{const_cast<float*>(p.initial.data()), p.numel()}, TensorRef{}});
      }
      OptimizerConfig config;
      config.algorithm = algorithm;
      optimizers_[algorithm] = std::make_unique<ZeroOptimizer>(alone, std::vector<ParamGroupSpec>{group}, config);
    }
  }

  // One step of each optimizer over the summed pushes (params no push names sit it out).
  void apply(const std::vector<RemotePush>& pushes) {
    for (auto& [algorithm, opt] : optimizers_) {
      std::vector<ParamId> without;
      for (const RemoteModelParam& p : model_) {
        if (p.algorithm != algorithm) continue;
        const ParamId id = where_[p.name].second;
        std::vector<float> sum = summed(pushes, p);
        if (sum.empty()) {
          without.push_back(id);
          sum.assign(static_cast<std::size_t>(p.numel()), 0.f);
        }
        std::memcpy(opt->grad_view(id).data, sum.data(), sum.size() * sizeof(float));
      }
      if (static_cast<int>(without.size()) == opt->num_params()) continue;
      opt->reduce_gradients();
      opt->step(without);
    }
  }

  std::vector<float> values(const std::string& name) const {
    const auto& at = where_.at(name);
    const TensorRef v = optimizers_.at(at.first)->param_view(at.second);
    return std::vector<float>(v.as<float>(), v.as<float>() + v.numel);
  }

 private:
  std::vector<RemoteModelParam> model_;
  std::map<Algorithm, std::unique_ptr<ZeroOptimizer>> optimizers_;
  std::map<std::string, std::pair<Algorithm, ParamId>> where_;
};

// Trainer `rank`'s step k of the schedule: open a context, push pushes_of(rank, k), step it.
inline void run_remote_step(shardopt::RemoteOptimizer& remote, int rank, int k, bool use_async = false) {
  const RemoteContext context = remote.open_context();
  const std::vector<RemotePush> pushes = pushes_of(rank, k);
  for (const RemotePush& push : pushes) {
    const RemoteParam handle = remote.lookup(push.param);
    if (push.rows.empty()) {
      remote.push(context, handle, push.values.data(), static_cast<int64_t>(push.values.size()));
    } else {
      remote.push_rows(context, handle, push.rows.data(), static_cast<int64_t>(push.rows.size()), push.values.data());
    }
  }
  if (use_async) {
    RemoteStepHandle step = remote.step_async(context);
    step.wait();
  } else {
    remote.step(context);
  }
}

}  // namespace shardopt_test
