// tests/capi/capi_api_support.hpp — raw-registered f32 models and per-step gradients shared by the C ABI's API tests.
#pragma once

#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_capi_api_test {

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Params "p0".."pN" with rank-independent values, registered raw (bucket view: initial values).
struct RawModel {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;
  std::vector<shardopt_param_desc> descs;

  RawModel(const std::vector<int64_t>& sizes, bool external) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(shardopt_test::seeded_values(7u + static_cast<uint32_t>(i), sizes[i]));
      grads.emplace_back(static_cast<std::size_t>(sizes[i]), 0.0f);
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param.data = values[i].data();
      d.param.numel = sizes[i];
      if (external) {
        d.grad.data = grads[i].data();
        d.grad.numel = sizes[i];
      }
      descs.push_back(d);
    }
  }

  shardopt_param_group_desc group(const shardopt_hyperparams* hyper = nullptr) const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs.data();
    g.num_params = descs.size();
    g.hyperparams = hyper;
    return g;
  }
};

// The same gradient on every rank for (param, step).
inline std::vector<float> grad_for(int32_t id, int step, int64_t n) {
  return shardopt_test::seeded_values(500u + static_cast<uint32_t>(97 * step + id), n);
}

}  // namespace shardopt_capi_api_test
