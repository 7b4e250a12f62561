// src/optim/param_table.hpp — the registered parameters and param groups: records, hyperparameters, defaults, and the local checks of a registration.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "partition/partition.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace optim {

struct ParamRecord {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();
  int32_t group = 0;
  std::vector<int64_t> shape;  // as registered (empty: 1-D of numel)
  bool trainable = true;
  void* user_param = nullptr;  // external storage only
  void* user_grad = nullptr;
  int64_t first_index = 0;  // position in the concatenation of all params in id order
  int64_t step = 0;
  bool has_momentum_buffer = false;  // torch creates it lazily, cloning d_p the first time
  bool sits_out_step = false;        // set for one step only: no gradient this step, left as it is
};

// The partition's view of a parameter: a Muon matrix is owned whole, placed by the cost of its
// Newton-Schulz (with its group's ns_steps).
partition::ParamInfo layout_info(int64_t numel, int32_t group, bool trainable, Algorithm algorithm,
                                 const std::vector<int64_t>& shape, const Hyperparams& group_hyper);

// "'fc.weight' (numel 9, f32, cpu, group 0)": what must agree across ranks about a parameter.
std::string describe(const ParamRecord& p);

// The device and dtype all parameters must share, and what fixed them (for messages).
struct DeviceChoice {
  bool fixed = false;
  Device device = Device::cpu();
  std::string source;
  bool dtype_fixed = false;
  DType dtype = DType::f32;
  std::string dtype_source;
};

// A group's state layout, resolved from its GroupSettings over the config's values: fixed for
// the group's life.
struct GroupStorage {
  StatePrecision state_precision = StatePrecision::fp32;
  MasterStorage master = MasterStorage::fp32;
};

// New groups, checked and resolved, not yet part of the table.
struct Registration {
  std::vector<ParamRecord> records;
  std::vector<Hyperparams> groups;
  std::vector<GroupStorage> storage;  // per group, beside `groups`
  std::vector<Algorithm> algorithms;        // per new group
  std::vector<const void*> initial_values;  // per record: bucket view's initial values (may be null)
  DeviceChoice choice;
};

class ParamTable {
 public:
  // `defaults` stand for every group's unset hyperparameters, whatever its algorithm.
  explicit ParamTable(Hyperparams defaults) : defaults_(defaults), defaults_explicit_(true) {}
  // config.defaults where set; else each group's unset fields take default_hyperparams(the
  // group's algorithm), and defaults() is that of config.algorithm.
  explicit ParamTable(const OptimizerConfig& config)
      : defaults_(config.defaults.value_or(default_hyperparams(config.algorithm))),
        defaults_explicit_(config.defaults.has_value()) {}

  // Local checks of `specs` as the next groups (names, numels, buffers, one device and one
  // dtype, hyperparameters with unset fields from the defaults). Throws the first problem.
  // `comm_device`: a device communicator's device fixes the parameters' device.
  Registration prepare(const std::vector<ParamGroupSpec>& specs, const OptimizerConfig& config,
                       Device comm_device, const std::string& comm_label, int rank) const;
  void append(Registration registration);

  std::size_t size() const { return params_.size(); }
  const std::vector<ParamRecord>& params() const { return params_; }
  const ParamRecord& param(ParamId id) const;
  ParamRecord& param(ParamId id);
  ParamId find(const std::string& name) const;

  int num_groups() const { return static_cast<int>(groups_.size()); }
  // A deque: references to a group stay valid when groups are added.
  const std::deque<Hyperparams>& groups() const { return groups_; }
  Hyperparams& group(int index);
  const GroupStorage& storage(int group) const { return storage_[static_cast<std::size_t>(group)]; }
  // Whether any group keeps its masters as `master` (bf16/f16 parameters only).
  bool any_master(MasterStorage master) const;
  // Whether param p keeps 8-bit moments: its group's state_precision is q8 and it has at least
  // bitsandbytes' min_8bit_size (4096) elements; smaller ones keep fp32 moments.
  bool q8_moments(const ParamRecord& p) const;
  bool any_q8() const;
  // Each group's algorithm, fixed for its life (a deque like groups()).
  const std::deque<Algorithm>& algorithms() const { return algorithms_; }
  Algorithm algorithm(int group) const;
  Algorithm param_algorithm(std::size_t i) const { return algorithms_[static_cast<std::size_t>(params_[i].group)]; }
  bool any_group_runs(Algorithm algorithm) const;
  const Hyperparams& defaults() const { return defaults_; }
  // What a new group of `algorithm` takes for its unset hyperparameters.
  Hyperparams defaults_for(Algorithm algorithm) const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  std::vector<partition::ParamInfo> infos() const;
  // infos() followed by the records of `added` (not yet appended).
  std::vector<partition::ParamInfo> infos_with(const Registration& added) const;

 private:
  Hyperparams defaults_;
  bool defaults_explicit_ = true;
  std::deque<Hyperparams> groups_;
  std::deque<GroupStorage> storage_;
  std::deque<Algorithm> algorithms_;
  std::vector<ParamRecord> params_;
  DType dtype_ = DType::f32;  // every parameter's: fixed by the first one
  Device device_ = Device::cpu();
};

// Checkpoints and state dicts read and write 8-bit moments in host memory: `operation` raises
// Error(unsupported) naming it when a group keeps them for parameters on a device.
void refuse_q8_on_device(const ParamTable& table, const char* operation);

}  // namespace optim
}  // namespace shardopt
