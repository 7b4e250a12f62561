// tests/remote/remote_model.hpp — the remote tests' model (an embedding split over the owners by rows, a matrix and an SGD bias) and its gradient schedule, the same on every rank.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "../mpi/mpi_test_support.hpp"

namespace shardopt_test {

struct RemoteModelParam {
  std::string name;
  int64_t rows;
  int64_t row_size;
  shardopt::Algorithm algorithm;
  std::vector<int> owners;  // the rows are split evenly over these, in order
  std::vector<float> initial;
  int64_t numel() const { return rows * row_size; }
  // Rows [begin, end) of owner index k.
  std::pair<int64_t, int64_t> rows_of(std::size_t k) const {
    const int64_t n = static_cast<int64_t>(owners.size());
    const int64_t i = static_cast<int64_t>(k);
    return {rows * i / n, rows * (i + 1) / n};
  }
};

// emb: AdamW (amsgrad, weight decay), rows split over every owner; w: AdamW on the last owner;
// b: SGD (momentum, dampening, weight decay) on the first one or two owners.
inline std::vector<RemoteModelParam> remote_model(const std::vector<int>& owners) {
  std::vector<RemoteModelParam> model;
  model.push_back({"emb", 12, 4, shardopt::Algorithm::adamw, owners, seeded_values(11, 48)});
  model.push_back({"w", 5, 3, shardopt::Algorithm::adamw, {owners.back()}, seeded_values(12, 15)});
  std::vector<int> bias_owners(owners.begin(), owners.begin() + std::min<std::size_t>(2, owners.size()));
  model.push_back({"b", 6, 1, shardopt::Algorithm::sgd, bias_owners, seeded_values(13, 6)});
  return model;
}

// The groups rank `rank` owns (one per parameter it holds rows of).
inline std::vector<shardopt::RemoteGroupSpec> owned_groups(const std::vector<RemoteModelParam>& model, int rank) {
  std::vector<shardopt::RemoteGroupSpec> groups;
  for (const RemoteModelParam& p : model) {
    for (std::size_t k = 0; k < p.owners.size(); ++k) {
      if (p.owners[k] != rank) continue;
      shardopt::RemoteGroupSpec g;
      g.algorithm = p.algorithm;
      g.hyper = busy_hyperparams(p.algorithm);
      const auto rows = p.rows_of(k);
      g.params.push_back({p.name, p.rows, p.row_size, rows.first, rows.second,
                          p.initial.data() + rows.first * p.row_size});
      groups.push_back(std::move(g));
    }
  }
  return groups;
}

// One push of trainer t's context at step k: dense (rows empty) or sparse rows.
struct RemotePush {
  std::string param;
  std::vector<int64_t> rows;
  std::vector<float> values;
};

inline std::vector<RemotePush> pushes_of(int t, int k) {
  const uint32_t seed = static_cast<uint32_t>(1000 + 100 * t + 10 * k);
  std::vector<RemotePush> out;
  if ((t + k) % 3 != 2) out.push_back({"emb", {}, seeded_values(seed + 1, 48)});
  out.push_back({"emb", {k % 12, (5 * t + 3) % 12, k % 12, 11}, seeded_values(seed + 2, 16)});
  if ((t + k) % 2 == 0) out.push_back({"w", {}, seeded_values(seed + 3, 15)});
  if (k != 1) {
    out.push_back({"b", {}, seeded_values(seed + 4, 6)});
    out.push_back({"b", {}, seeded_values(seed + 5, 6)});
  }
  return out;
}

// The f32 sum an owner forms of `pushes` for `param` (zeros, then each push added in order);
// empty when none names it.
inline std::vector<float> summed(const std::vector<RemotePush>& pushes, const RemoteModelParam& param) {
  std::vector<float> sum;
  for (const RemotePush& push : pushes) {
    if (push.param != param.name) continue;
    if (sum.empty()) sum.assign(static_cast<std::size_t>(param.numel()), 0.f);
    if (push.rows.empty()) {
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += push.values[i];
      continue;
    }
    for (std::size_t r = 0; r < push.rows.size(); ++r) {
      for (int64_t j = 0; j < param.row_size; ++j) {
        sum[static_cast<std::size_t>(push.rows[r] * param.row_size + j)] +=
            push.values[r * static_cast<std::size_t>(param.row_size) + static_cast<std::size_t>(j)];
      }
    }
  }
  return sum;
}

}  // namespace shardopt_test
