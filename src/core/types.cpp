// src/core/types.cpp — names of dtypes, devices, algorithms, state precisions, master storages and partitions, and the library version.
#include <string>

#include "shardopt/shardopt.hpp"

namespace shardopt {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::byte: return "byte";
  }
  return "unknown-dtype";
}

std::string device_name(Device device) {
  if (device.is_cpu()) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::sgd: return "sgd";
    case Algorithm::adam: return "adam";
    case Algorithm::adamw: return "adamw";
    case Algorithm::muon: return "muon";
  }
  return "unknown";
}

const char* muon_lr_adjust_name(MuonLrAdjust adjust) {
  switch (adjust) {
    case MuonLrAdjust::none: return "none";
    case MuonLrAdjust::original: return "original";
    case MuonLrAdjust::match_rms_adamw: return "match_rms_adamw";
    case MuonLrAdjust::spectral_unclamped: return "spectral_unclamped";
  }
  return "unknown";
}

const char* state_precision_name(StatePrecision precision) {
  switch (precision) {
    case StatePrecision::fp32: return "fp32";
    case StatePrecision::q8: return "q8";
  }
  return "unknown";
}

const char* master_storage_name(MasterStorage master) {
  switch (master) {
    case MasterStorage::fp32: return "fp32";
    case MasterStorage::remainder16: return "remainder16";
  }
  return "unknown";
}

const char* partition_name(PartitionStrategy partition) {
  switch (partition) {
    case PartitionStrategy::flat: return "flat";
    case PartitionStrategy::sorted_greedy: return "sorted_greedy";
  }
  return "unknown";
}

const char* overlap_policy_name(OverlapPolicy policy) {
  switch (policy) {
    case OverlapPolicy::off: return "off";
    case OverlapPolicy::after_backward: return "after_backward";
    case OverlapPolicy::per_bucket: return "per_bucket";
  }
  return "unknown";
}

const char* version() { return SHARDOPT_VERSION_STRING; }

}  // namespace shardopt
