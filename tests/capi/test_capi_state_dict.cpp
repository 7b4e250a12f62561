// tests/capi/test_capi_state_dict.cpp — the consolidated state dict read through the C ABI equals the C++ API's dict bit for bit (names, numels, dtypes, groups, steps, state kinds and values), on rank `to` only; size checks and bad arguments.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::last_error;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<int64_t> kSizes = {13, 7, 20, 5};
// Params 0..2 in group 0, param 3 in group 1; param 1 is frozen (no state).
constexpr std::size_t kGroup0 = 3;

// The rank-dependent gradient of param `id` at `step`: small integers over 8, exact in f32.
std::vector<float> grad_of(int rank, int id, int step, int64_t numel) {
  std::vector<float> g(static_cast<std::size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) g[i] = static_cast<float>((rank + 1) * (id + 2) + step - (i % 5)) / 8.0f;
  return g;
}

struct Training {
  shardopt::Algorithm algorithm;
  shardopt::Hyperparams hyper0, hyper1;
};

Training training_for(shardopt_algorithm algorithm) {
  Training t;
  t.algorithm = static_cast<shardopt::Algorithm>(algorithm);
  t.hyper0 = shardopt::default_hyperparams(t.algorithm);
  t.hyper0.lr = 0.01;
  t.hyper1 = t.hyper0;
  t.hyper1.lr = 0.02;
  t.hyper1.weight_decay = 0.1;
  if (algorithm == SHARDOPT_ALGORITHM_SGD) {
    t.hyper0.momentum = t.hyper1.momentum = 0.9;
  } else {
    t.hyper0.amsgrad = true;  // max_exp_avg_sq too
  }
  return t;
}

shardopt_hyperparams c_hyper(const shardopt::Hyperparams& h) {
  shardopt_hyperparams c;
  shardopt_hyperparams_init(&c);
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.momentum = h.momentum;
  c.dampening = h.dampening;
  c.nesterov = h.nesterov;
  c.maximize = h.maximize;
  c.amsgrad = h.amsgrad;
  return c;
}

// The same training through the C ABI: `steps` steps of grad_of, consolidated on `to`.
shardopt_optimizer_t train_c(const CommHandle& comm, const Training& t, shardopt_partition partition, int steps,
                             int to) {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<shardopt_param_desc> descs;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    names.push_back("layer" + std::to_string(i) + ".weight");
    values.push_back(shardopt_test::seeded_values(71u + static_cast<uint32_t>(i), kSizes[i]));
  }
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    shardopt_param_desc d;
    shardopt_param_desc_init(&d);
    d.name = names[i].c_str();
    d.param.data = values[i].data();
    d.param.numel = kSizes[i];
    descs.push_back(d);
  }
  const shardopt_hyperparams h0 = c_hyper(t.hyper0), h1 = c_hyper(t.hyper1);
  shardopt_param_group_desc groups[2];
  shardopt_param_group_desc_init(&groups[0]);
  groups[0].params = descs.data();
  groups[0].num_params = kGroup0;
  groups[0].hyperparams = &h0;
  shardopt_param_group_desc_init(&groups[1]);
  groups[1].params = descs.data() + kGroup0;
  groups[1].num_params = descs.size() - kGroup0;
  groups[1].hyperparams = &h1;
  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = static_cast<shardopt_algorithm>(t.algorithm);
  config.partition = partition;
  config.bucket_bytes = 64;
  shardopt_optimizer_t opt = nullptr;
  {
    const shardopt_status status = shardopt_optimizer_create(comm.get(), &config, groups, 2, &opt);
    INFO(last_error());
    REQUIRE(status == SHARDOPT_OK);
  }
  REQUIRE(shardopt_optimizer_set_trainable(opt, 1, 0) == SHARDOPT_OK);
  for (int step = 0; step < steps; ++step) {
    for (int32_t id = 0; id < static_cast<int32_t>(kSizes.size()); ++id) {
      if (id == 1) continue;
      shardopt_tensor g{};
      REQUIRE(shardopt_optimizer_grad_view(opt, id, &g) == SHARDOPT_OK);
      const std::vector<float> values_now = grad_of(comm.rank(), id, step, kSizes[id]);
      std::memcpy(g.data, values_now.data(), values_now.size() * sizeof(float));
    }
    REQUIRE(shardopt_optimizer_reduce_gradients(opt) == SHARDOPT_OK);
    REQUIRE(shardopt_optimizer_step(opt) == SHARDOPT_OK);
  }
  REQUIRE(shardopt_optimizer_consolidate_state_dict(opt, to) == SHARDOPT_OK);
  return opt;
}

// The same training through the C++ API.
std::unique_ptr<shardopt::ZeroOptimizer> train_cpp(const Training& t, shardopt::PartitionStrategy partition,
                                                   int steps, int to) {
  shardopt::OptimizerConfig config;
  config.algorithm = t.algorithm;
  config.partition = partition;
  config.bucket_bytes = 64;
  std::vector<std::vector<float>> values;
  std::vector<shardopt::ParamGroupSpec> groups(2);
  groups[0].hyper = t.hyper0;
  groups[1].hyper = t.hyper1;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    values.push_back(shardopt_test::seeded_values(71u + static_cast<uint32_t>(i), kSizes[i]));
  }
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    shardopt::ParamSpec spec;
    spec.name = "layer" + std::to_string(i) + ".weight";
    spec.param.data = values[i].data();
    spec.param.numel = kSizes[i];
    groups[i < kGroup0 ? 0 : 1].params.push_back(spec);
  }
  auto opt = std::make_unique<shardopt::ZeroOptimizer>(shardopt_test::world(), config, groups);
  opt->set_trainable(1, false);
  const int rank = shardopt_test::world()->rank();
  for (int step = 0; step < steps; ++step) {
    for (int id = 0; id < static_cast<int>(kSizes.size()); ++id) {
      if (id == 1) continue;
      const std::vector<float> g = grad_of(rank, id, step, kSizes[id]);
      std::memcpy(opt->grad_view(id).data, g.data(), g.size() * sizeof(float));
    }
    opt->reduce_gradients();
    opt->step();
  }
  opt->consolidate_state_dict(to);
  return opt;
}

void check_same_hyper(const shardopt_hyperparams& c, const shardopt::Hyperparams& h) {
  CHECK(c.lr == h.lr);
  CHECK(c.beta1 == h.beta1);
  CHECK(c.beta2 == h.beta2);
  CHECK(c.eps == h.eps);
  CHECK(c.weight_decay == h.weight_decay);
  CHECK(c.momentum == h.momentum);
  CHECK(c.dampening == h.dampening);
  CHECK(c.nesterov == (h.nesterov ? 1 : 0));
  CHECK(c.maximize == (h.maximize ? 1 : 0));
  CHECK(c.amsgrad == (h.amsgrad ? 1 : 0));
}

// Everything the C dict holds against the C++ dict, bit for bit.
void check_same_dict(shardopt_state_dict_t dict, const shardopt::StateDict& expected) {
  shardopt_state_dict_info info;
  shardopt_state_dict_info_init(&info);
  REQUIRE(shardopt_state_dict_get_info(dict, &info) == SHARDOPT_OK);
  CHECK(info.algorithm == static_cast<shardopt_algorithm>(expected.algorithm));
  REQUIRE(info.num_params == static_cast<int32_t>(expected.param_names.size()));
  REQUIRE(info.num_groups == static_cast<int32_t>(expected.param_groups.size()));
  CHECK(info.num_stateful == static_cast<int32_t>(expected.state.size()));
  CHECK(info.num_stateful == static_cast<int32_t>(kSizes.size()) - 1);  // all but the frozen one

  for (int32_t g = 0; g < info.num_groups; ++g) {
    shardopt_hyperparams hyper;
    shardopt_hyperparams_init(&hyper);
    int32_t count = -1;
    REQUIRE(shardopt_state_dict_get_group(dict, g, &hyper, &count) == SHARDOPT_OK);
    check_same_hyper(hyper, expected.param_groups[g].hyper);
    REQUIRE(count == static_cast<int32_t>(expected.param_groups[g].params.size()));
    std::vector<int32_t> ids(static_cast<std::size_t>(count), -1);
    REQUIRE(shardopt_state_dict_group_params(dict, g, ids.data(), ids.size()) == SHARDOPT_OK);
    CHECK(ids == std::vector<int32_t>(expected.param_groups[g].params.begin(), expected.param_groups[g].params.end()));
  }

  for (int32_t id = 0; id < info.num_params; ++id) {
    CAPTURE(id);
    shardopt_state_dict_param param;
    shardopt_state_dict_param_init(&param);
    REQUIRE(shardopt_state_dict_get_param(dict, id, &param) == SHARDOPT_OK);
    CHECK(std::string(param.name) == expected.param_names[id]);
    CHECK(std::string(param.name) == "layer" + std::to_string(id) + ".weight");
    CHECK(param.numel == kSizes[id]);
    CHECK(param.dtype == SHARDOPT_DTYPE_F32);
    CHECK(param.group == (id < static_cast<int32_t>(kGroup0) ? 0 : 1));
    const auto state = expected.state.find(id);
    if (state == expected.state.end()) {
      CHECK(id == 1);
      CHECK(param.num_states == 0);
      CHECK(param.step == 0);
      continue;
    }
    CHECK(param.step == state->second.step);
    REQUIRE(param.num_states == static_cast<int32_t>(state->second.tensors.size()));
    int32_t index = 0;
    for (const auto& [kind, values] : state->second.tensors) {
      const char* c_kind = nullptr;
      REQUIRE(shardopt_state_dict_state_kind(dict, id, index++, &c_kind) == SHARDOPT_OK);
      REQUIRE(std::string(c_kind) == kind);
      std::vector<float> copy(static_cast<std::size_t>(param.numel), -7.0f);
      REQUIRE(shardopt_state_dict_copy_state(dict, id, c_kind, copy.data(), copy.size() * sizeof(float)) ==
              SHARDOPT_OK);
      CHECK(shardopt_test::bitwise_equal(copy, values));
    }
  }
}

}  // namespace

TEST_CASE("the consolidated state dict read from C is the C++ dict, bit for bit, on rank `to` only",
          "[capi][state_dict]") {
  CommHandle comm;
  const int size = comm.size(), rank = comm.rank();
  const auto algorithm = GENERATE(SHARDOPT_ALGORITHM_ADAMW, SHARDOPT_ALGORITHM_SGD);
  const auto partition = GENERATE(SHARDOPT_PARTITION_FLAT, SHARDOPT_PARTITION_SORTED_GREEDY);
  CAPTURE(algorithm, partition);
  const int to = size - 1;  // a non-zero rank where there are several
  const Training t = training_for(algorithm);
  shardopt_optimizer_t opt = train_c(comm, t, partition, 3, to);
  auto reference = train_cpp(t, static_cast<shardopt::PartitionStrategy>(partition), 3, to);

  shardopt_state_dict_t dict = nullptr;
  const shardopt_status status = shardopt_optimizer_state_dict(opt, &dict);
  if (rank != to) {
    // As the C++ state_dict() refuses: this rank holds no consolidated dict.
    CHECK(status == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(dict == nullptr);
    CHECK(contains(last_error(), "shardopt_optimizer_state_dict: state_dict(): rank " + std::to_string(rank) +
                                     " holds no consolidated state"));
    REQUIRE_THROWS_AS(reference->state_dict(), shardopt::Error);
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    return;
  }
  INFO(last_error());
  REQUIRE(status == SHARDOPT_OK);
  const shardopt::StateDict expected = reference->state_dict();
  REQUIRE(expected.state.size() == kSizes.size() - 1);
  check_same_dict(dict, expected);

  // The kinds each algorithm keeps, by name (in name order), with steps counted.
  shardopt_state_dict_param p0;
  shardopt_state_dict_param_init(&p0);
  REQUIRE(shardopt_state_dict_get_param(dict, 0, &p0) == SHARDOPT_OK);
  CHECK(p0.step == 3);
  std::vector<std::string> kinds;
  for (int32_t i = 0; i < p0.num_states; ++i) {
    const char* k = nullptr;
    REQUIRE(shardopt_state_dict_state_kind(dict, 0, i, &k) == SHARDOPT_OK);
    kinds.push_back(k);
  }
  if (algorithm == SHARDOPT_ALGORITHM_SGD) {
    CHECK(kinds == std::vector<std::string>{"momentum_buffer"});
  } else {
    CHECK(kinds == std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  }

  // A snapshot: the optimizer steps on (alone: a step is collective, so only at np 1) or goes
  // away, and the dict still reads the same.
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
  check_same_dict(dict, expected);
  REQUIRE(shardopt_state_dict_destroy(dict) == SHARDOPT_OK);
  CHECK(shardopt_state_dict_destroy(nullptr) == SHARDOPT_OK);
}

TEST_CASE("SGD's momentum buffer read from C after one step is the averaged gradient", "[capi][state_dict]") {
  CommHandle comm;
  const int size = comm.size();
  const Training t = training_for(SHARDOPT_ALGORITHM_SGD);
  shardopt_optimizer_t opt = train_c(comm, t, SHARDOPT_PARTITION_FLAT, 1, 0);
  if (comm.rank() == 0) {
    shardopt_state_dict_t dict = nullptr;
    REQUIRE(shardopt_optimizer_state_dict(opt, &dict) == SHARDOPT_OK);
    // Param 0 has no weight decay: torch's first momentum buffer is the gradient itself.
    std::vector<float> expected(static_cast<std::size_t>(kSizes[0]), 0.0f);
    for (int r = 0; r < size; ++r) {
      const std::vector<float> g = grad_of(r, 0, 0, kSizes[0]);
      for (std::size_t i = 0; i < g.size(); ++i) expected[i] += g[i];
    }
    for (float& v : expected) v /= static_cast<float>(size);
    std::vector<float> got(expected.size(), -1.0f);
    REQUIRE(shardopt_state_dict_copy_state(dict, 0, "momentum_buffer", got.data(), got.size() * 4) == SHARDOPT_OK);
    CHECK(got == expected);
    REQUIRE(shardopt_state_dict_destroy(dict) == SHARDOPT_OK);
  }
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("the C state dict refuses wrong sizes, kinds, ids and handles by name", "[capi][state_dict][errors]") {
  CommHandle comm;
  const Training t = training_for(SHARDOPT_ALGORITHM_ADAM);
  shardopt_optimizer_t opt = train_c(comm, t, SHARDOPT_PARTITION_FLAT, 2, 0);
  if (comm.rank() != 0) {
    REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
    return;
  }
  shardopt_state_dict_t dict = nullptr;
  REQUIRE(shardopt_optimizer_state_dict(opt, &dict) == SHARDOPT_OK);
  const std::size_t bytes = static_cast<std::size_t>(kSizes[0]) * sizeof(float);
  std::vector<float> buffer(static_cast<std::size_t>(kSizes[0]) + 1, -3.0f);

  // A buffer one element short or long: refused, and nothing written.
  for (const std::size_t wrong : {bytes - 4, bytes + 4, std::size_t{0}}) {
    CAPTURE(wrong);
    CHECK(shardopt_state_dict_copy_state(dict, 0, "exp_avg", buffer.data(), wrong) == SHARDOPT_ERR_INVALID_ARGUMENT);
    CHECK(last_error() == "shardopt_state_dict_copy_state: dst_bytes is " + std::to_string(wrong) +
                              ", but state 'exp_avg' of parameter 'layer0.weight' is 13 fp32 values, 52 bytes");
    for (float v : buffer) CHECK(v == -3.0f);
  }
  CHECK(shardopt_state_dict_copy_state(dict, 0, "exp_avg", nullptr, bytes) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_state_dict_copy_state: dst is NULL");
  CHECK(shardopt_state_dict_copy_state(dict, 0, nullptr, buffer.data(), bytes) == SHARDOPT_ERR_NULL_POINTER);
  // A kind Adam does not keep, and a frozen param's state.
  CHECK(shardopt_state_dict_copy_state(dict, 0, "momentum_buffer", buffer.data(), bytes) ==
        SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_state_dict_copy_state: parameter 'layer0.weight' has no state 'momentum_buffer'; "
                        "it has 'exp_avg', 'exp_avg_sq', 'max_exp_avg_sq'");
  CHECK(shardopt_state_dict_copy_state(dict, 1, "exp_avg", buffer.data(), 7 * 4) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "parameter 'layer1.weight' has no state 'exp_avg'; it has no state"));
  // Ids, indices and groups out of range.
  shardopt_state_dict_param param;
  shardopt_state_dict_param_init(&param);
  CHECK(shardopt_state_dict_get_param(dict, 4, &param) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_state_dict_get_param: id 4 is not a parameter of this state dict (0..3)");
  CHECK(shardopt_state_dict_get_param(dict, -1, &param) == SHARDOPT_ERR_INVALID_ARGUMENT);
  const char* kind = nullptr;
  CHECK(shardopt_state_dict_state_kind(dict, 0, 3, &kind) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "index 3 is not a state kind of parameter 'layer0.weight', which has 3"));
  CHECK(shardopt_state_dict_get_group(dict, 2, nullptr, nullptr) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "group 2 is not a param group of this state dict (0..1)"));
  int32_t ids[3];
  CHECK(shardopt_state_dict_group_params(dict, 0, ids, 2) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "capacity is 2, but group 0 has 3 parameters"));
  // Struct sizes of no version.
  param.struct_size = 8;
  CHECK(shardopt_state_dict_get_param(dict, 0, &param) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is 8"));
  shardopt_state_dict_info info;
  shardopt_state_dict_info_init(&info);
  info.struct_size = sizeof(info) + 8;
  CHECK(shardopt_state_dict_get_info(dict, &info) == SHARDOPT_ERR_STRUCT_SIZE);
  // Handles: the optimizer is no state dict, a destroyed dict is no longer one.
  CHECK(shardopt_state_dict_get_info(reinterpret_cast<shardopt_state_dict_t>(opt), &info) ==
        SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "is a shardopt_optimizer_t, not a shardopt_state_dict_t"));
  CHECK(shardopt_optimizer_state_dict(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_state_dict_destroy(dict) == SHARDOPT_OK);
  info.struct_size = sizeof(info);
  CHECK(shardopt_state_dict_get_info(dict, &info) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(shardopt_state_dict_get_info(nullptr, &info) == SHARDOPT_ERR_NULL_POINTER);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
