// tests/capi/test_capi_training.cpp — the C ABI's ZeRO-2, bf16/f16, clipping and loss scaling: stage-2 reduce_gradient round trips, bf16 steps against the C++ API, clip norms against hand-computed values, skipped steps, and earlier struct sizes still accepted.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- 16-bit floats ------------------------------------------------------------------------------

uint32_t bits_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of_bits(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even (finite values).
uint16_t bf16_of(float f) {
  const uint32_t u = bits_of(f);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float float_of_bf16(uint16_t h) { return float_of_bits(static_cast<uint32_t>(h) << 16); }

constexpr uint16_t kF16Inf = 0x7c00;

// Values exactly representable as normal f16 numbers (or zero) only: the tests choose them so.
uint16_t f16_of(float f) {
  if (f == 0.0f) return 0;
  const uint32_t u = bits_of(f);
  const int exponent = static_cast<int>((u >> 23) & 0xffu) - 127 + 15;
  REQUIRE((u & 0x1fffu) == 0);  // no more than f16's 10 mantissa bits
  REQUIRE(exponent > 0);
  REQUIRE(exponent < 31);
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | (static_cast<uint32_t>(exponent) << 10) |
                               ((u & 0x7fffffu) >> 13));
}

float float_of_f16(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0 && mantissa == 0) return float_of_bits(sign);
  if (exponent == 31) return float_of_bits(sign | 0x7f800000u | (mantissa << 13));
  REQUIRE(exponent != 0);  // no subnormals in these tests
  return float_of_bits(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

// ---- models -------------------------------------------------------------------------------------

shardopt_tensor cpu_tensor(void* data, int64_t numel, shardopt_dtype dtype) {
  shardopt_tensor t;
  t.data = data;
  t.numel = numel;
  t.dtype = dtype;
  t.device_kind = SHARDOPT_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

// Params "p0".."pN" of `dtype` (16-bit values kept as raw bits) registered raw: bucket view
// (initial values) or external (the caller's parameter and gradient buffers).
struct Model16 {
  std::vector<std::string> names;
  std::vector<std::vector<uint16_t>> values;
  std::vector<std::vector<uint16_t>> grads;
  std::vector<shardopt_param_desc> descs;

  Model16(const std::vector<int64_t>& sizes, shardopt_dtype dtype, bool external,
          const std::vector<std::vector<uint16_t>>& initial) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(initial[i]);
      grads.emplace_back(static_cast<std::size_t>(sizes[i]), uint16_t{0});
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param = cpu_tensor(values[i].data(), sizes[i], dtype);
      if (external) d.grad = cpu_tensor(grads[i].data(), sizes[i], dtype);
      descs.push_back(d);
    }
  }

  shardopt_param_group_desc group(const shardopt_hyperparams* hyper) const {
    shardopt_param_group_desc g;
    shardopt_param_group_desc_init(&g);
    g.params = descs.data();
    g.num_params = descs.size();
    g.hyperparams = hyper;
    return g;
  }
};

// f32 params "p0".."pN" with rank-independent initial values, bucket view.
struct Model32 {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<shardopt_param_desc> descs;

  explicit Model32(const std::vector<int64_t>& sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back("p" + std::to_string(i));
      values.push_back(shardopt_test::seeded_values(31u + static_cast<uint32_t>(i), sizes[i]));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      shardopt_param_desc d;
      shardopt_param_desc_init(&d);
      d.name = names[i].c_str();
      d.param = cpu_tensor(values[i].data(), sizes[i], SHARDOPT_DTYPE_F32);
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

// Creates an optimizer, failing the test (with the message) if it cannot.
shardopt_optimizer_t create(const CommHandle& comm, const shardopt_optimizer_config& config,
                            const shardopt_param_group_desc& group) {
  shardopt_optimizer_t opt = nullptr;
  const shardopt_status status = shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt);
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  return opt;
}

template <typename T>
std::vector<T> param_values(shardopt_optimizer_t opt, int32_t id) {
  shardopt_tensor v{};
  REQUIRE(shardopt_optimizer_param_view(opt, id, &v) == SHARDOPT_OK);
  const T* data = static_cast<const T*>(v.data);
  return std::vector<T>(data, data + v.numel);
}

shardopt_step_report last_step(shardopt_optimizer_t opt) {
  shardopt_step_report report;
  shardopt_step_report_init(&report);
  REQUIRE(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_OK);
  return report;
}

double loss_scale(shardopt_optimizer_t opt) {
  double scale = -1.0;
  REQUIRE(shardopt_optimizer_loss_scale(opt, &scale) == SHARDOPT_OK);
  return scale;
}

// A gradient whose sum over any number of ranks is exact in f32 (multiples of 1/8, small), so
// that every reduction order and collective gives the same bits.
float exact_grad(int32_t id, int step, int64_t i, int rank) {
  return 0.125f * static_cast<float>((i * 3 + id + step) % 9 - 4) * static_cast<float>(rank + 1);
}

}  // namespace

// ---- bf16 / f16 parameters ------------------------------------------------------------------------

TEST_CASE("bf16 parameters step through the C ABI exactly as through the C++ API", "[capi][precision]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 200, 1};
  std::vector<std::vector<uint16_t>> initial;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint16_t> v;
    for (float f : shardopt_test::seeded_values(11u + static_cast<uint32_t>(i), sizes[i])) v.push_back(bf16_of(f));
    initial.push_back(v);
  }
  Model16 model(sizes, SHARDOPT_DTYPE_BF16, false, initial);

  bool stochastic = false;
  SECTION("round to nearest even") { stochastic = false; }
  SECTION("stochastic rounding, seeded") { stochastic = true; }

  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;  // several buckets
  config.stochastic_rounding = stochastic ? 1 : 0;
  config.rounding_seed = 1234;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  // The C++ reference with the same config, and one whose rounding differs (another seed, or
  // stochastic instead of nearest): the C config's fields must reach the optimizer.
  auto reference_config = [&](uint64_t seed, bool sr) {
    shardopt::OptimizerConfig c;
    c.algorithm = shardopt::Algorithm::adamw;
    c.bucket_bytes = 64;
    c.stochastic_rounding = sr;
    c.rounding_seed = seed;
    return c;
  };
  shardopt::ParamGroupSpec spec;
  spec.hyper.lr = 0.01;
  spec.hyper.weight_decay = 0.1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    spec.params.push_back(
        {model.names[i], {initial[i].data(), sizes[i], shardopt::DType::bf16, shardopt::Device::cpu()}, {}});
  }
  shardopt::ZeroOptimizer reference(shardopt_test::world(), reference_config(1234, stochastic), {spec});
  shardopt::ZeroOptimizer other(shardopt_test::world(), reference_config(stochastic ? 1235 : 1234, true), {spec});

  for (int step = 0; step < 3; ++step) {
    REQUIRE(shardopt_optimizer_zero_grad(opt) == SHARDOPT_OK);
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      const int64_t n = sizes[static_cast<std::size_t>(id)];
      std::vector<uint16_t> g;
      for (float f : shardopt_test::seeded_values(900u + static_cast<uint32_t>(31 * step + id), n)) {
        g.push_back(bf16_of(f));
      }
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      REQUIRE(view.dtype == SHARDOPT_DTYPE_BF16);
      REQUIRE(view.numel == n);
      std::memcpy(view.data, g.data(), g.size() * 2);
      std::memcpy(reference.grad_view(id).data, g.data(), g.size() * 2);
      std::memcpy(other.grad_view(id).data, g.data(), g.size() * 2);
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    for (shardopt::ZeroOptimizer* r : {&reference, &other}) {
      r->reduce_gradients();
      r->step();
    }
  }
  bool differs_from_other = false;
  int64_t moved = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_param_view(opt, id, &view) == SHARDOPT_OK);
    CHECK(view.dtype == SHARDOPT_DTYPE_BF16);
    const std::size_t bytes = static_cast<std::size_t>(view.numel) * 2;
    CHECK(std::memcmp(view.data, reference.param_view(id).data, bytes) == 0);
    differs_from_other = differs_from_other || std::memcmp(view.data, other.param_view(id).data, bytes) != 0;
    const uint16_t* now = static_cast<const uint16_t*>(view.data);
    for (int64_t i = 0; i < view.numel; ++i) moved += now[i] != initial[static_cast<std::size_t>(id)][static_cast<std::size_t>(i)];
  }
  // Three AdamW steps of about lr = 0.01 against bf16's 2^-8 relative spacing: most weights
  // moved (a few random-gradient steps may cancel out below half a bf16 spacing).
  CHECK(moved > 243 / 2);
  CHECK(differs_from_other);  // 243 elements, 3 steps: some rounding decision differs

  // The report's new fields, against the C++ API and the per-component rule: an fp32 master
  // copy and Adam's two moments for this rank's shard only.
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  const shardopt::MemoryReport expected = reference.memory_report();
  CHECK(report.state_bytes == expected.state_bytes);
  CHECK(report.master_bytes == expected.master_bytes);
  CHECK(report.param_bytes == expected.param_bytes);
  CHECK(report.grad_bytes == expected.grad_bytes);
  CHECK(report.buffer_bytes == expected.buffer_bytes);
  CHECK(report.param_buffer_bytes == expected.param_bytes);
  CHECK(report.grad_buffer_bytes == expected.grad_bytes + expected.buffer_bytes);
  CHECK(report.shard_numel == expected.shard_numel);
  CHECK(report.trainable_numel == 243);
  CHECK(report.master_bytes == 4 * report.shard_numel);
  CHECK(report.state_bytes == 8 * report.shard_numel);
  // The bf16 flat buffer (with the shards' alignment padding): this rank's own, or its node's.
  CHECK(report.param_bytes + report.node_shared_param_bytes >= 2 * 243);
  CHECK(report.node_shared_param_bytes == expected.node_shared_param_bytes);
  CHECK(report.node_ranks == (comm.size() > 1 ? comm.size() : 1));
  if (comm.size() > 1) CHECK(report.shard_numel < 243);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("bf16 external buffers: averaged gradients and SGD updates land in the caller's bf16 memory",
          "[capi][precision]") {
  CommHandle comm;
  const int world = comm.size();
  const std::vector<int64_t> sizes = {19, 4};
  std::vector<std::vector<uint16_t>> initial;
  for (int64_t n : sizes) initial.emplace_back(static_cast<std::size_t>(n), bf16_of(1.0f));
  Model16 model(sizes, SHARDOPT_DTYPE_BF16, true, initial);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.storage = SHARDOPT_STORAGE_EXTERNAL;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.5;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  // Rank r's gradient 0.25 (r + 1): the average 0.125 (world + 1) and every partial sum are exact
  // in bf16, and so is 1 - 0.5 * average for 1, 2 or 3 ranks.
  for (auto& g : model.grads) std::fill(g.begin(), g.end(), bf16_of(0.25f * static_cast<float>(comm.rank() + 1)));
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  const float average = 0.125f * static_cast<float>(world + 1);
  CHECK(float_of_bf16(model.grads[0][0]) == average);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  for (const auto& values : model.values) {
    for (uint16_t v : values) CHECK(float_of_bf16(v) == 1.0f - 0.5f * average);
  }
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("bf16 and f16 tensors are accepted through DLPack and raw; one optimizer takes one dtype",
          "[capi][precision]") {
  CommHandle comm;
  FakeTensor w({4, 2}), b({3});
  w.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 16, 1};
  b.managed.dl_tensor.dtype = DLDataType{kDLBfloat, 16, 1};
  shardopt_param_desc params[2];
  shardopt_param_desc_init(&params[0]);
  params[0].name = "w";
  params[0].param_dlpack = &w.managed;
  shardopt_param_desc_init(&params[1]);
  params[1].name = "b";
  params[1].param_dlpack = &b.managed;
  shardopt_param_group_desc group;
  shardopt_param_group_desc_init(&group);
  group.params = params;
  group.num_params = 2;
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  shardopt_tensor view{};
  REQUIRE(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_OK);
  CHECK(view.dtype == SHARDOPT_DTYPE_BF16);
  CHECK(view.numel == 8);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  CHECK(w.deletes == 1);
  CHECK(b.deletes == 1);

  // f16 with f32 in one optimizer: both valid dtypes, but an optimizer has one flat buffer.
  std::vector<uint16_t> half(4, f16_of(1.0f));
  std::vector<float> single(4, 1.0f);
  params[0] = shardopt_param_desc{};
  shardopt_param_desc_init(&params[0]);
  params[0].name = "half";
  params[0].param = cpu_tensor(half.data(), 4, SHARDOPT_DTYPE_F16);
  shardopt_param_desc_init(&params[1]);
  params[1].name = "single";
  params[1].param = cpu_tensor(single.data(), 4, SHARDOPT_DTYPE_F32);
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_ERR_UNSUPPORTED);
  CHECK(contains(last_error(), "all parameters of an optimizer share one dtype"));
  CHECK(opt == nullptr);
}

// ---- stage 2 --------------------------------------------------------------------------------------

TEST_CASE("stage 2: gradients handed with reduce_gradient give the stage-1 steps bitwise", "[capi][stage2]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 128, 1};
  Model32 model1(sizes), model2(sizes);
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.01;
  hyper.weight_decay = 0.1;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;  // 16 elements: parameters span buckets, buckets span parameters
  const shardopt_param_group_desc group1 = model1.group(&hyper);
  shardopt_optimizer_t stage1 = create(comm, config, group1);
  config.stage = 2;
  const shardopt_param_group_desc group2 = model2.group(&hyper);
  shardopt_optimizer_t stage2 = create(comm, config, group2);

  // p2 is handed as a DLPack tensor, consumed by each successful call.
  FakeTensor dl({128});
  for (int step = 0; step < 3; ++step) {
    REQUIRE(shardopt_optimizer_zero_grad(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_zero_grad(stage2) == SHARDOPT_OK);
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      const int64_t n = sizes[static_cast<std::size_t>(id)];
      std::vector<float> g(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = exact_grad(id, step, i, comm.rank());
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(stage1, id, &view) == SHARDOPT_OK);
      std::memcpy(view.data, g.data(), g.size() * sizeof(float));
      if (id == 2) {
        std::copy(g.begin(), g.end(), dl.storage.begin());
        const int before = dl.deletes;
        REQUIRE(shardopt_optimizer_reduce_gradient_dlpack(stage2, id, &dl.managed) == SHARDOPT_OK);
        CHECK(dl.deletes == before + 1);
      } else {
        const shardopt_tensor grad = cpu_tensor(g.data(), n, SHARDOPT_DTYPE_F32);
        const shardopt_status status = shardopt_optimizer_reduce_gradient(stage2, id, &grad);
        INFO(last_error());
        REQUIRE(status == SHARDOPT_OK);
        g.assign(g.size(), std::nanf(""));  // read before the call returned: the buffer is free again
      }
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_reduce_gradients(stage2) == SHARDOPT_OK);
    // The norm over the shards' averaged gradients is the same at both stages.
    double norm1 = -1, norm2 = -2;
    REQUIRE(shardopt_optimizer_clip_grad_norm(stage1, 1e9, 2.0, &norm1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_clip_grad_norm(stage2, 1e9, 2.0, &norm2) == SHARDOPT_OK);
    CHECK(norm1 > 0);
    CHECK(norm2 == Approx(norm1).epsilon(1e-6));
    REQUIRE(shardopt_optimizer_step(stage1) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(stage2) == SHARDOPT_OK);
  }
  CHECK(dl.deletes == 3);
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
    const std::vector<float> a = param_values<float>(stage1, id), b = param_values<float>(stage2, id);
    CHECK(shardopt_test::bitwise_equal(a, b));
    CHECK(a[0] != model1.values[static_cast<std::size_t>(id)][0]);  // it moved
    int64_t steps = 0;
    REQUIRE(shardopt_optimizer_param_step(stage2, id, &steps) == SHARDOPT_OK);
    CHECK(steps == 3);
  }

  // Stage 2 keeps the gradients of this rank's shard only.
  shardopt_memory_report r1, r2;
  shardopt_memory_report_init(&r1);
  shardopt_memory_report_init(&r2);
  REQUIRE(shardopt_optimizer_memory_report(stage1, &r1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_memory_report(stage2, &r2) == SHARDOPT_OK);
  CHECK(r2.shard_numel == r1.shard_numel);
  CHECK(r2.grad_bytes == 4 * r2.shard_numel);
  CHECK(r1.grad_bytes >= 4 * 171);  // the whole flat gradient buffer
  CHECK(r1.master_bytes == 0);      // f32 params are their own master
  if (comm.size() > 1) CHECK(r2.grad_bytes < r1.grad_bytes);
  REQUIRE(shardopt_optimizer_destroy(stage1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(stage2) == SHARDOPT_OK);
}

TEST_CASE("reduce_gradient refusals come back as statuses with messages", "[capi][stage2][errors]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {6, 3};
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.stage = 2;
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = create(comm, config, group);
  std::vector<float> g0(6, 1.0f), g1(3, 1.0f);
  const shardopt_tensor grad0 = cpu_tensor(g0.data(), 6, SHARDOPT_DTYPE_F32);
  const shardopt_tensor grad1 = cpu_tensor(g1.data(), 3, SHARDOPT_DTYPE_F32);

  shardopt_tensor view{};
  CHECK(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "shardopt_optimizer_grad_view: "));
  CHECK(contains(last_error(), "reduce_gradient()"));
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient: grad is NULL");
  CHECK(shardopt_optimizer_reduce_gradient(nullptr, 0, &grad0) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient_dlpack: grad is NULL");
  CHECK(shardopt_optimizer_reduce_gradient(opt, 7, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "parameter id 7 is out of range"));
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad1) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "shardopt_optimizer_reduce_gradient: "));
  CHECK(contains(last_error(), "the gradient of 'p0' has 3 elements"));
  shardopt_tensor bad = grad0;
  bad.dtype = static_cast<shardopt_dtype>(9);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_optimizer_reduce_gradient: grad: dtype 9 is not a shardopt_dtype (0..2)");
  bad = grad0;
  bad.dtype = SHARDOPT_DTYPE_BF16;
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "bf16"));
  // A refused DLPack tensor stays the caller's: its deleter does not run.
  FakeTensor frozen({6});
  frozen.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, &frozen.managed) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "read-only"));
  FakeTensor wrong({5});
  CHECK(shardopt_optimizer_reduce_gradient_dlpack(opt, 0, &wrong.managed) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "has 5 elements"));
  CHECK(frozen.deletes + wrong.deletes == 0);

  // A second hand-over of the same param in one round (on every rank alike); the round still
  // finishes once every param is in.
  REQUIRE(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_OK);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "already handed"));
  REQUIRE(shardopt_optimizer_reduce_gradient(opt, 1, &grad1) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // Stage 1, and stage 2 with external storage, have no use for it.
  config.stage = 1;
  opt = create(comm, config, group);
  CHECK(shardopt_optimizer_reduce_gradient(opt, 0, &grad0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "reduce_gradient() is for stage 2"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("config->stage other than 1 or 2 is refused on every rank, naming the field", "[capi][stage2][errors]") {
  CommHandle comm;
  Model32 model({4});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  shardopt_optimizer_t opt = nullptr;
  for (int32_t stage : {3, 0, -1}) {
    config.stage = stage;
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error() == "shardopt_optimizer_create: config->stage is " + std::to_string(stage) +
                              "; it must be 1 (ZeRO-1) or 2 (ZeRO-2)");
  }
  config.stage = 2;
  config.shard_state = 0;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "it needs config->shard_state = 1"));
  CHECK(opt == nullptr);

  if (comm.size() > 1) {
    // Only rank 1 asks for stage 3: the others learn it from the collective check. (The rank is
    // read first: a successful call clears the last error.)
    const bool culprit = comm.rank() == 1;
    shardopt_optimizer_config_init(&config);
    if (culprit) config.stage = 3;
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    if (culprit) {
      CHECK(contains(last_error(), "config->stage is 3"));
    } else {
      CHECK(contains(last_error(), "failed on rank 1: config->stage is 3"));
    }
    CHECK(opt == nullptr);
  }
}

// ---- clip_grad_norm ---------------------------------------------------------------------------------

TEST_CASE("clip_grad_norm returns the total norm and the next step applies the clip factor", "[capi][clip]") {
  CommHandle comm;
  const std::vector<int64_t> sizes = {37, 5, 128, 1};  // P = 171 elements
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.bucket_bytes = 64;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 1.0;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);

  auto fill_grads = [&](float value) {
    for (int32_t id = 0; id < 4; ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      std::fill(static_cast<float*>(view.data), static_cast<float*>(view.data) + view.numel, value);
    }
  };

  // Every gradient 1.0 on every rank: the average is 1.0 and the 2-norm sqrt(171).
  fill_grads(1.0f);
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  double norm = -1.0;
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, &norm) == SHARDOPT_OK);
  CHECK(norm == Approx(std::sqrt(171.0)).epsilon(1e-6));
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  const double coef = 1.0 / (std::sqrt(171.0) + 1e-6);
  shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1.0);
  CHECK(report.grad_norm == norm);
  CHECK(report.clip_coef == Approx(coef).epsilon(1e-6));
  CHECK(report.skipped_steps == 0);
  // SGD, lr 1: each weight moved by exactly the clip factor; the gradients kept their values.
  for (int32_t id = 0; id < 4; ++id) {
    const std::vector<float> now = param_values<float>(opt, id);
    for (std::size_t i = 0; i < now.size(); ++i) {
      CHECK(now[i] == Approx(model.values[static_cast<std::size_t>(id)][i] - coef).margin(1e-6));
    }
    shardopt_tensor g{};
    REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
    CHECK(static_cast<float*>(g.data)[0] == 1.0f);
  }

  // One element -4, the rest 1: 2-norm sqrt(170 + 16), inf-norm 4; a max_norm above the norm
  // leaves the gradients alone (factor 1).
  fill_grads(1.0f);
  {
    shardopt_tensor view{};
    REQUIRE(shardopt_optimizer_grad_view(opt, 2, &view) == SHARDOPT_OK);
    static_cast<float*>(view.data)[5] = -4.0f;
  }
  REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1e6, 2.0, &norm) == SHARDOPT_OK);
  CHECK(norm == Approx(std::sqrt(186.0)).epsilon(1e-6));
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 100.0, std::numeric_limits<double>::infinity(), &norm) ==
          SHARDOPT_OK);
  CHECK(norm == 4.0);
  const std::vector<float> before = param_values<float>(opt, 2);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.grad_norm == 4.0);
  CHECK(report.clip_coef == 1.0);
  const std::vector<float> after = param_values<float>(opt, 2);
  CHECK(after[5] == before[5] + 4.0f);
  CHECK(after[0] == before[0] - 1.0f);

  // Without clip_grad_norm before it, a step reports no norm; out_norm may be NULL.
  fill_grads(0.0f);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.grad_norm == -1.0);
  CHECK(report.clip_coef == 1.0);
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, nullptr) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("clip_grad_norm and last_step refusals come back as statuses with messages", "[capi][clip][errors]") {
  CommHandle comm;
  Model32 model({8});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  shardopt_optimizer_t opt = create(comm, config, group);
  double norm = 12345.0;
  for (double norm_type : {1.0, 0.0, 3.0, -std::numeric_limits<double>::infinity()}) {
    CHECK(shardopt_optimizer_clip_grad_norm(opt, 1.0, norm_type, &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    CHECK(contains(last_error(), "shardopt_optimizer_clip_grad_norm: "));
    CHECK(contains(last_error(), "is not supported (2 or inf)"));
  }
  CHECK(contains(last_error(), "norm_type -inf"));
  CHECK(shardopt_optimizer_clip_grad_norm(opt, 1.0, std::nan(""), &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(shardopt_optimizer_clip_grad_norm(opt, -1.0, 2.0, &norm) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "max_norm"));
  CHECK(shardopt_optimizer_clip_grad_norm(opt, std::numeric_limits<double>::infinity(), 2.0, &norm) ==
        SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(norm == 12345.0);  // untouched by refused calls
  CHECK(shardopt_optimizer_clip_grad_norm(nullptr, 1.0, 2.0, &norm) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(contains(last_error(), "shardopt_optimizer_clip_grad_norm: opt is NULL;"));

  // A refused clip leaves no factor behind.
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  shardopt_step_report report = last_step(opt);
  CHECK(report.grad_norm == -1.0);
  CHECK(report.clip_coef == 1.0);

  CHECK(shardopt_optimizer_last_step(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_last_step: out is NULL");
  report.struct_size = 0;
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is 0"));
  CHECK(contains(last_error(), "shardopt_step_report_init()"));
  report.struct_size = sizeof(report) + 8;
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  shardopt_step_report_init(&report);
  CHECK(shardopt_optimizer_last_step(opt, &report) == SHARDOPT_ERR_BAD_HANDLE);
}

// ---- loss scaling -----------------------------------------------------------------------------------

TEST_CASE("loss scaling over f16 parameters: the scale grows, an inf on one rank skips the step everywhere",
          "[capi][loss_scaling]") {
  CommHandle comm;
  const int rank = comm.rank(), last = comm.size() - 1;
  const std::vector<int64_t> sizes = {40, 3};
  std::vector<std::vector<uint16_t>> initial;
  for (int64_t n : sizes) initial.emplace_back(static_cast<std::size_t>(n), f16_of(1.0f));
  Model16 model(sizes, SHARDOPT_DTYPE_F16, false, initial);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_SGD;
  config.loss_scaling.enabled = 1;
  config.loss_scaling.init_scale = 1024.0;
  config.loss_scaling.growth_interval = 2;
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.25;
  const shardopt_param_group_desc group = model.group(&hyper);
  shardopt_optimizer_t opt = create(comm, config, group);
  CHECK(loss_scale(opt) == 1024.0);

  // No reduce_gradients: every rank writes the same gradient (so it is its own average), except
  // where one rank injects an inf that only it sees, so the step's own agreement must spread it.
  // Each rank checks the gradients of its shard: rank 0 gets the inf at the first param's 4th
  // element (its shard starts the flat partition), the last rank at the very last element.
  // Scaled gradients 0.5 * scale unscale to 0.5; SGD lr 0.25 moves each weight by 0.125,
  // exactly in f16.
  auto write_grads = [&](double scale, int inf_rank) {
    for (int32_t id = 0; id < 2; ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      REQUIRE(view.dtype == SHARDOPT_DTYPE_F16);
      uint16_t* g = static_cast<uint16_t*>(view.data);
      std::fill(g, g + view.numel, f16_of(static_cast<float>(0.5 * scale)));
      if (rank != inf_rank) continue;
      if (inf_rank == 0 && id == 0) g[3] = kF16Inf;
      if (inf_rank != 0 && id == 1) g[view.numel - 1] = kF16Inf;
    }
  };
  auto all_params_are = [&](float expected) {
    for (int32_t id = 0; id < 2; ++id) {
      for (uint16_t v : param_values<uint16_t>(opt, id)) CHECK(float_of_f16(v) == expected);
    }
  };

  write_grads(1024.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.875f);
  shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1024.0);
  CHECK(report.skipped_steps == 0);
  CHECK(loss_scale(opt) == 1024.0);  // one clean step of the two before growth

  write_grads(1024.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.75f);
  CHECK(loss_scale(opt) == 2048.0);  // grown after growth_interval clean steps

  // An inf on rank 0 only: every rank skips (no update, no step count), the scale backs off.
  write_grads(2048.0, 0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.skipped == 1);
  CHECK(report.loss_scale == 2048.0);
  CHECK(report.skipped_steps == 1);
  CHECK(loss_scale(opt) == 1024.0);
  all_params_are(0.75f);
  int64_t steps = 0;
  REQUIRE(shardopt_optimizer_param_step(opt, 0, &steps) == SHARDOPT_OK);
  CHECK(steps == 2);

  // Resuming at another scale; the gradients follow it.
  REQUIRE(shardopt_optimizer_set_loss_scale(opt, 512.0) == SHARDOPT_OK);
  CHECK(loss_scale(opt) == 512.0);
  write_grads(512.0, -1);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  all_params_are(0.625f);
  report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 512.0);
  CHECK(report.grad_norm == -1.0);

  // An inf on the last rank seen by clip_grad_norm first: the norm is NaN on every rank, and
  // the step is skipped.
  write_grads(512.0, last);
  double norm = 0.0;
  REQUIRE(shardopt_optimizer_clip_grad_norm(opt, 1.0, 2.0, &norm) == SHARDOPT_OK);
  CHECK(std::isnan(norm));
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  report = last_step(opt);
  CHECK(report.skipped == 1);
  CHECK(report.skipped_steps == 2);
  CHECK(std::isnan(report.grad_norm));
  CHECK(loss_scale(opt) == 256.0);
  all_params_are(0.625f);

  // Refused scales leave the scale as it was.
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    CHECK(shardopt_optimizer_set_loss_scale(opt, bad) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "shardopt_optimizer_set_loss_scale: "));
    CHECK(contains(last_error(), "must be finite and > 0"));
  }
  CHECK(loss_scale(opt) == 256.0);
  CHECK(shardopt_optimizer_loss_scale(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_loss_scale: out is NULL");
  CHECK(shardopt_optimizer_set_loss_scale(nullptr, 2.0) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("without loss scaling the scale is 1 and cannot be set; bad loss_scaling fields are refused",
          "[capi][loss_scaling][errors]") {
  CommHandle comm;
  Model32 model({8});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  // Disabled: the other fields are ignored, however wrong.
  config.loss_scaling.init_scale = -5.0;
  config.loss_scaling.growth_interval = 0;
  shardopt_optimizer_t opt = create(comm, config, group);
  CHECK(loss_scale(opt) == 1.0);
  CHECK(shardopt_optimizer_set_loss_scale(opt, 8.0) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "loss scaling is not enabled"));
  CHECK(loss_scale(opt) == 1.0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  const shardopt_step_report report = last_step(opt);
  CHECK(report.skipped == 0);
  CHECK(report.loss_scale == 1.0);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  struct Case {
    void (*change)(shardopt_loss_scaling&);
    const char* message;
  };
  const Case cases[] = {
      {[](shardopt_loss_scaling& l) { l.init_scale = 0.0; }, "config->loss_scaling.init_scale must be finite and > 0, got 0"},
      {[](shardopt_loss_scaling& l) { l.init_scale = std::numeric_limits<double>::infinity(); }, "init_scale must be finite"},
      {[](shardopt_loss_scaling& l) { l.growth_factor = 1.0; }, "config->loss_scaling.growth_factor must be finite and > 1, got 1"},
      {[](shardopt_loss_scaling& l) { l.backoff_factor = 1.0; }, "config->loss_scaling.backoff_factor must be in (0, 1), got 1"},
      {[](shardopt_loss_scaling& l) { l.backoff_factor = 0.0; }, "backoff_factor must be in (0, 1)"},
      {[](shardopt_loss_scaling& l) { l.growth_interval = 0; }, "config->loss_scaling.growth_interval must be > 0, got 0"},
      {[](shardopt_loss_scaling& l) { l.min_scale = 1e9; }, "config->loss_scaling.min_scale must be finite, > 0 and <= init_scale"},
      {[](shardopt_loss_scaling& l) { l.min_scale = std::nan(""); }, "min_scale must be finite"},
  };
  for (const Case& c : cases) {
    shardopt_optimizer_config_init(&config);
    config.loss_scaling.enabled = 1;
    c.change(config.loss_scaling);
    CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_INVALID_ARGUMENT);
    INFO(last_error());
    CHECK(contains(last_error(), std::string("shardopt_optimizer_create: ")));
    CHECK(contains(last_error(), c.message));
    CHECK(opt == nullptr);
  }
}

// ---- struct sizes of earlier headers ------------------------------------------------------------------

namespace {

// The two structs as the earlier header declared them, before fields were appended.
struct config_before_stage {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
};

// The second version, before `defaults` was appended.
struct config_before_defaults {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
};

// The header before node_shared_params: through `defaults`.
struct config_before_node_sharing {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
};

// The header before pipeline_chunk_bytes: through node_shared_params.
struct config_before_pipelining {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
};

struct config_before_join {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
};

struct config_before_overlap {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
};

struct config_before_muon {
  size_t struct_size;
  shardopt_algorithm algorithm;
  shardopt_partition partition;
  shardopt_storage storage;
  int32_t shard_state;
  int64_t bucket_bytes;
  int32_t threads;
  int32_t stage;
  int32_t stochastic_rounding;
  uint64_t rounding_seed;
  shardopt_loss_scaling loss_scaling;
  const shardopt_hyperparams* defaults;
  int32_t node_shared_params;
  int64_t pipeline_chunk_bytes;
  int32_t divide_by_initial_world_size;
  int64_t overlap;
};

struct memory_report_before_master {
  size_t struct_size;
  int64_t state_bytes;
  int64_t param_buffer_bytes;
  int64_t grad_buffer_bytes;
  int64_t shard_numel;
  int64_t trainable_numel;
};

}  // namespace

TEST_CASE("struct sizes of the earlier header are still accepted; others are refused", "[capi][errors][versions]") {
  CommHandle comm;
  Model32 model({9, 7});
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;

  // An earlier program's config: exactly its size on the heap (reading past it is an ASan
  // error), its tail padding (where `stage` now lies) garbage.
  auto old = std::make_unique<config_before_stage>();
  std::memset(old.get(), 0xab, sizeof(config_before_stage));
  old->struct_size = sizeof(config_before_stage);
  old->algorithm = SHARDOPT_ALGORITHM_SGD;
  old->partition = SHARDOPT_PARTITION_FLAT;
  old->storage = SHARDOPT_STORAGE_BUCKET_VIEW;
  old->shard_state = 1;
  old->bucket_bytes = 64;
  old->threads = 0;
  REQUIRE(sizeof(config_before_stage) < sizeof(shardopt_optimizer_config));
  {
    const shardopt_status status = shardopt_optimizer_create(
        comm.get(), reinterpret_cast<const shardopt_optimizer_config*>(old.get()), &group, 1, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
  }
  // The appended fields took their defaults: stage 1 (grad views work), no loss scaling.
  shardopt_tensor view{};
  REQUIRE(shardopt_optimizer_grad_view(opt, 0, &view) == SHARDOPT_OK);
  CHECK(loss_scale(opt) == 1.0);
  REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);

  // An earlier program's memory report: the first five fields only, nothing written past them.
  auto old_report = std::make_unique<memory_report_before_master>();
  std::memset(old_report.get(), 0, sizeof(memory_report_before_master));
  old_report->struct_size = sizeof(memory_report_before_master);
  REQUIRE(shardopt_optimizer_memory_report(opt, reinterpret_cast<shardopt_memory_report*>(old_report.get())) ==
          SHARDOPT_OK);
  shardopt_memory_report report;
  shardopt_memory_report_init(&report);
  REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
  CHECK(old_report->struct_size == sizeof(memory_report_before_master));
  CHECK(old_report->state_bytes == report.state_bytes);
  CHECK(old_report->param_buffer_bytes == report.param_buffer_bytes);
  CHECK(old_report->grad_buffer_bytes == report.grad_buffer_bytes);
  CHECK(old_report->shard_numel == report.shard_numel);
  CHECK(old_report->trainable_numel == 16);
  CHECK(report.param_bytes + report.node_shared_param_bytes > 0);  // node-shared by default
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  // Sizes of no version: below the oldest, between versions, above the newest.
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  const std::string accepts = "which also accepts " + std::to_string(sizeof(config_before_stage)) + ", " +
                              std::to_string(sizeof(config_before_defaults)) + ", " +
                              std::to_string(sizeof(config_before_node_sharing)) + ", " +
                              std::to_string(sizeof(config_before_pipelining)) + ", " +
                              std::to_string(sizeof(config_before_join)) + ", " +
                              std::to_string(sizeof(config_before_overlap)) + ", " +
                              std::to_string(sizeof(config_before_muon)) + " from earlier headers";
  config.struct_size = sizeof(config_before_stage) - 8;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "too small"));
  CHECK(contains(last_error(), accepts));
  const std::size_t between = sizeof(config_before_stage) + 8;  // between the first two versions
  REQUIRE(between < sizeof(config_before_defaults));
  config.struct_size = between;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(last_error() == "shardopt_optimizer_create: config->struct_size is " + std::to_string(between) +
                            ", but shardopt_optimizer_config is " + std::to_string(sizeof(config)) +
                            " bytes in this library, " + accepts +
                            " (not the size of any version it knows); set it to sizeof(shardopt_optimizer_config), "
                            "e.g. with shardopt_optimizer_config_init()");
  config.struct_size = sizeof(config) + 8;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  CHECK(opt == nullptr);

  config.struct_size = sizeof(config);
  opt = create(comm, config, group);
  report.struct_size = sizeof(memory_report_before_master) + 8;
  CHECK(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is " + std::to_string(sizeof(memory_report_before_master) + 8)));
  CHECK(contains(last_error(), "shardopt_memory_report_init()"));
  report.struct_size = sizeof(report) + 8;
  CHECK(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("node_shared_params: one parameter buffer per node, or one per rank when off", "[capi][node_sharing]") {
  CommHandle comm;
  Model32 model({300, 17});
  const shardopt_param_group_desc group = model.group();
  for (int32_t shared : {1, 0}) {
    CAPTURE(shared);
    shardopt_optimizer_config config;
    shardopt_optimizer_config_init(&config);
    CHECK(config.node_shared_params == 1);  // the default
    config.node_shared_params = shared;
    shardopt_optimizer_t opt = create(comm, config, group);
    shardopt_memory_report report;
    shardopt_memory_report_init(&report);
    REQUIRE(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_OK);
    const bool sharing = shared != 0 && comm.size() > 1;  // all ranks of these tests share a node
    CHECK((report.param_bytes > 0) == !sharing);
    CHECK((report.node_shared_param_bytes > 0) == sharing);
    CHECK(report.param_bytes + report.node_shared_param_bytes >= 4 * 317);
    CHECK(report.node_ranks == (sharing ? comm.size() : 1));
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  }
}

// ---- Join -----------------------------------------------------------------------------------------

namespace {

// Rank r takes 1 + r steps through the C ABI, then joins; returns its parameters.
std::vector<std::vector<float>> uneven_c_run(const CommHandle& comm, int32_t divide_by_world) {
  const std::vector<int64_t> sizes = {37, 5, 128};
  Model32 model(sizes);
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = SHARDOPT_ALGORITHM_ADAMW;
  config.bucket_bytes = 64;
  config.divide_by_initial_world_size = divide_by_world;
  shardopt_optimizer_t opt = create(comm, config, model.group());
  for (int step = 0; step < 1 + comm.rank(); ++step) {
    for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) {
      shardopt_tensor view{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &view) == SHARDOPT_OK);
      float* g = static_cast<float*>(view.data);
      for (int64_t i = 0; i < view.numel; ++i) g[i] = exact_grad(id, step, i, comm.rank());
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  const shardopt_status joined = shardopt_optimizer_join(opt);
  INFO(last_error());
  REQUIRE(joined == SHARDOPT_OK);
  std::vector<std::vector<float>> params;
  for (int32_t id = 0; id < static_cast<int32_t>(sizes.size()); ++id) params.push_back(param_values<float>(opt, id));
  shardopt_optimizer_destroy(opt);
  return params;
}

}  // namespace

TEST_CASE("join through the C ABI: uneven steps leave every rank with the same parameters", "[capi][join]") {
  CommHandle comm;
  const std::vector<std::vector<float>> by_active = uneven_c_run(comm, 0);
  // Rank 0's values reach every rank bit for bit: each rank compares its own with them.
  for (const std::vector<float>& p : by_active) {
    std::vector<float> root = p;
    shardopt_test::world()->broadcast(root.data(), static_cast<int64_t>(root.size()), shardopt::DType::f32, 0);
    CHECK(shardopt_test::bitwise_equal(root, p));
  }
  if (comm.size() > 1) {
    // The divisor option travels in the appended config field.
    const std::vector<std::vector<float>> by_world = uneven_c_run(comm, 1);
    CHECK_FALSE(shardopt_test::bitwise_equal(by_world[0], by_active[0]));
  }
}

