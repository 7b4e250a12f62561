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
  bool trainable = true;
  void* user_param = nullptr;  // external storage only
  void* user_grad = nullptr;
  int64_t first_index = 0;  // position in the concatenation of all params in id order
  int64_t step = 0;
  bool has_momentum_buffer = false;  // torch creates it lazily, cloning d_p the first time
  bool sits_out_step = false;        // set for one step only: no gradient this step, left as it is
};

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
  std::vector<const void*> initial_values;  // per record: bucket view's initial values (may be null)
  DeviceChoice choice;
};

class ParamTable {
 public:
  explicit ParamTable(Hyperparams defaults) : defaults_(defaults) {}

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
  const Hyperparams& defaults() const { return defaults_; }
  DType dtype() const { return dtype_; }

  std::vector<partition::ParamInfo> infos() const;

 private:
  Hyperparams defaults_;
  std::deque<Hyperparams> groups_;
  std::deque<GroupStorage> storage_;
  std::vector<ParamRecord> params_;
  DType dtype_ = DType::f32;  // every parameter's: fixed by the first one
  Device device_ = Device::cpu();
};

// 8-bit moments are laid out once and are not in checkpoints or state dicts yet: `operation`
// (a layout change, a checkpoint, a state dict) raises Error(unsupported) naming it when any
// group keeps them (or `adds_q8`, for groups being added).
void refuse_with_q8(const ParamTable& table, const char* operation, bool adds_q8 = false);

}  // namespace optim
}  // namespace shardopt
