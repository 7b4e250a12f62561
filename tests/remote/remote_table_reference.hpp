// tests/remote/remote_table_reference.hpp — the one-rank reference of a table trained by row pushes under plain SGD: a local ZeroOptimizer stepped on each context's f32 sum, in the remote optimizer's deterministic order.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "remote_model.hpp"

namespace shardopt_test {

// One push_rows call: `rows` and their values, row_size floats each.
struct RowPush {
  std::vector<int64_t> rows;
  std::vector<float> values;
};

// What trainer `t` pushed into its context of step `k`: row pushes in push order, then a dense
// push of the whole table (empty: none).
struct TablePushes {
  std::function<std::vector<RowPush>(int t, int k)> rows_of;
  std::function<std::vector<float>(int t, int k)> dense_of;
};

// The table after `steps` step numbers of `trainers` trainers each, stepped on one rank (over
// `alone`) step number by step number, trainer by trainer (the deterministic order), each over
// the f32 sum of that context's pushes in push order, as the owners sum them.
inline std::vector<float> sgd_table_reference(const std::shared_ptr<shardopt::Communicator>& alone,
                                              const std::vector<float>& initial, int64_t row_size, double lr,
                                              int steps, int trainers, const TablePushes& pushes) {
  std::vector<float> values = initial;
  shardopt::ParamGroupSpec group;
  group.hyper.lr = lr;
  const int64_t numel = static_cast<int64_t>(values.size());
  group.params.push_back(shardopt::ParamSpec{"table", shardopt::TensorRef{values.data(), numel}, shardopt::TensorRef{}});
  shardopt::OptimizerConfig config;
  config.algorithm = shardopt::Algorithm::sgd;
  shardopt::ZeroOptimizer reference(alone, {group}, config);
  for (int k = 0; k < steps; ++k) {
    for (int t = 0; t < trainers; ++t) {
      std::vector<float> sum(values.size(), 0.f);
      for (const RowPush& push : pushes.rows_of(t, k)) {
        for (std::size_t j = 0; j < push.rows.size(); ++j) {
          for (int64_t e = 0; e < row_size; ++e) {
            sum[static_cast<std::size_t>(push.rows[j] * row_size + e)] +=
                push.values[j * static_cast<std::size_t>(row_size) + static_cast<std::size_t>(e)];
          }
        }
      }
      if (pushes.dense_of) {
        const std::vector<float> dense = pushes.dense_of(t, k);
        for (std::size_t e = 0; e < dense.size(); ++e) sum[e] += dense[e];
      }
      std::memcpy(reference.grad_view(0).data, sum.data(), sum.size() * sizeof(float));
      reference.reduce_gradients();
      reference.step();
    }
  }
  const shardopt::TensorRef view = reference.param_view(0);
  return std::vector<float>(view.as<float>(), view.as<float>() + view.numel);
}

}  // namespace shardopt_test
