// tests/mpi/test_node_sharing.cpp — node-shared parameters: one buffer per node, bitwise the same results as a buffer per rank, on one node and on several (nodes made by CommOptions.ranks_per_node).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float -> bf16, nearest even

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {1000, 3, 517, 64, 2049, 1};

struct Setup {
  int stage = 1;
  PartitionStrategy partition = PartitionStrategy::flat;
  DType dtype = DType::f32;
  Algorithm algorithm = Algorithm::adamw;
  bool external = false;  // the caller's buffers; the sync's staging is what nodes share
};

// The same parameters on every rank, in the given dtype.
struct Values {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<std::vector<float>> grads;  // external storage's gradient buffers (f32 sized)
  explicit Values(uint32_t seed) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      f32.push_back(shardopt_test::seeded_values(seed + static_cast<uint32_t>(i), kSizes[i]));
      std::vector<uint16_t> half;
      for (float x : f32.back()) half.push_back(kernels::float_to_bf16(x));
      bf16.push_back(std::move(half));
      grads.emplace_back(static_cast<std::size_t>(kSizes[i]), 0.f);
    }
  }
  void* data(std::size_t i, DType dtype) {
    return dtype == DType::f32 ? static_cast<void*>(f32[i].data()) : static_cast<void*>(bf16[i].data());
  }
};

std::unique_ptr<ZeroOptimizer> build(const std::shared_ptr<Communicator>& comm, const Setup& s, bool shared,
                                     Values& values) {
  OptimizerConfig config;
  config.algorithm = s.algorithm;
  config.partition = s.partition;
  config.stage = s.stage;
  config.node_shared_params = shared;
  config.storage = s.external ? Storage::external : Storage::bucket_view;
  config.bucket_bytes = 1024;  // several buckets per shard
  ParamGroupSpec group;
  group.hyper = shardopt_test::busy_hyperparams(s.algorithm);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{values.data(i, s.dtype), kSizes[i], s.dtype, Device::cpu()};
    if (s.external) p.grad = TensorRef{values.grads[i].data(), kSizes[i], s.dtype, Device::cpu()};
    group.params.push_back(p);
  }
  return std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
}

// One training step's gradients (the same on every rank, different each step), handed over as
// the stage asks.
void step_once(ZeroOptimizer& opt, const Setup& s, uint32_t seed) {
  Values grads(seed);
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const auto i = static_cast<std::size_t>(id);
    const TensorRef g{grads.data(i, s.dtype), kSizes[i], s.dtype, Device::cpu()};
    if (s.stage == 2) {
      if (opt.trainable(id)) opt.reduce_gradient(id, g);
    } else {
      std::memcpy(opt.grad_view(id).data, g.data, g.nbytes());
    }
  }
  opt.reduce_gradients();
  opt.step();
}

std::vector<uint8_t> param_bytes(const ZeroOptimizer& opt) {
  std::vector<uint8_t> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = opt.param_view(id);
    const auto* p = static_cast<const uint8_t*>(v.data);
    out.insert(out.end(), p, p + v.nbytes());
  }
  return out;
}

std::shared_ptr<Communicator> world_with_nodes_of(int ranks_per_node) {
  CommOptions options;
  options.timeout_seconds = 60;
  options.ranks_per_node = ranks_per_node;
  return mpi_world(options);
}

// Ranks on this rank's node when nodes hold `per_node` consecutive ranks (0: all of them).
int expected_node_ranks(int per_node) {
  const int n = world()->size(), me = world()->rank();
  if (per_node == 0) return n;
  const int first = me / per_node * per_node;
  return std::min(n, first + per_node) - first;
}

void check_same_as_private(const std::shared_ptr<Communicator>& comm, const Setup& s, int per_node) {
  Values a(11), b(11);
  auto shared = build(comm, s, true, a);
  auto own = build(comm, s, false, b);
  const MemoryReport sr = shared->memory_report(), orep = own->memory_report();
  const bool shares = comm->size() > 1 && [&] {
    // Sharing applies when some node has several ranks.
    int largest = 0;
    for (int r = 0; r < comm->size(); ++r) {
      const int first = per_node == 0 ? 0 : r / per_node * per_node;
      const int size = per_node == 0 ? comm->size() : std::min(comm->size(), first + per_node) - first;
      largest = std::max(largest, size);
    }
    return largest > 1;
  }();
  CHECK(orep.node_shared_param_bytes == 0);
  CHECK(orep.node_ranks == 1);
  // What is shared: the parameters (bucket view) or the sync's staging (external storage,
  // counted in buffer_bytes with the gradient staging when private).
  // External storage, with every rank on one node, also copies the gradients into a node-shared
  // slot per rank (buffer_bytes): the trainable elements and the shards' alignment padding (16
  // each); at stage 1 it then needs no private staging bucket (bucket_bytes 1024 here). Stage 2
  // with bucket view on one node keeps the same slot as its gradient buffer (grad_bytes, below).
  // (Also on nodes of equal size: the hierarchical reduction uses the same slots.)
  const bool one_node = shares && (per_node == 0 || comm->size() <= per_node || comm->size() % per_node == 0);
  const bool slot = one_node && s.external;
  const int64_t extra = sr.param_bytes + sr.buffer_bytes + sr.node_shared_param_bytes - (orep.param_bytes + orep.buffer_bytes);
  const int64_t element = static_cast<int64_t>(dtype_size(s.dtype));
  if (slot) {
    const int64_t private_staging = s.stage == 1 ? std::min<int64_t>(sr.trainable_numel * element, 1024) : 0;
    CHECK(extra >= sr.trainable_numel * element - private_staging);
    CHECK(extra <= (sr.trainable_numel + 16 * comm->size()) * element - private_staging);
  } else {
    CHECK(extra == 0);
  }
  const int64_t extra_grads = sr.grad_bytes - orep.grad_bytes;
  if (one_node && s.stage == 2 && !s.external) {
    // The slot. On one node the shard's average is summed into the slot's own positions, so the
    // shard buffer the unshared optimizer keeps is not there; across nodes it is, beside the slot.
    const bool across_nodes = per_node > 0 && comm->size() > per_node;
    const int64_t shard_kept = across_nodes ? 0 : sr.shard_numel * element;
    CHECK(extra_grads >= sr.trainable_numel * element - shard_kept);
    CHECK(extra_grads <= (sr.trainable_numel + 16 * comm->size()) * element - shard_kept);
  } else {
    CHECK(extra_grads == 0);
  }
  if (shares) {
    CHECK(sr.node_shared_param_bytes > 0);
    if (!s.external) CHECK(sr.param_bytes == 0);
    CHECK(sr.node_ranks == expected_node_ranks(per_node));
  } else {
    CHECK(sr.param_bytes == orep.param_bytes);
    CHECK(sr.node_shared_param_bytes == 0);
  }
  REQUIRE(param_bytes(*shared) == param_bytes(*own));
  for (uint32_t k = 0; k < 3; ++k) {
    step_once(*shared, s, 100 + k);
    step_once(*own, s, 100 + k);
    REQUIRE(param_bytes(*shared) == param_bytes(*own));
  }
  // A layout change (freezing a param and thawing it) carries the values over alike.
  shared->set_trainable(2, false);
  own->set_trainable(2, false);
  step_once(*shared, s, 200);
  step_once(*own, s, 200);
  REQUIRE(param_bytes(*shared) == param_bytes(*own));
  shared->set_trainable(2, true);
  own->set_trainable(2, true);
  step_once(*shared, s, 300);
  step_once(*own, s, 300);
  REQUIRE(param_bytes(*shared) == param_bytes(*own));
}

}  // namespace

TEST_CASE("node-shared parameters step bitwise as a buffer per rank", "[node_sharing]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        Setup s;
        s.stage = stage;
        s.partition = partition;
        s.dtype = dtype;
        CAPTURE(stage, static_cast<int>(partition), dtype_name(dtype));
        check_same_as_private(world(), s, 0);
      }
    }
  }
}

TEST_CASE("node-shared parameters over several nodes: each shard crosses between nodes once", "[node_sharing]") {
  // 1 rank per node: nothing to share; 2: nodes of two (and of one at odd world sizes, so the
  // exchange between nodes runs through the nodes' first ranks); 3: uneven nodes at 4 ranks.
  for (int per_node : {1, 2, 3}) {
    const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
    for (int stage : {1, 2}) {
      Setup s;
      s.stage = stage;
      s.algorithm = stage == 1 ? Algorithm::adamw : Algorithm::sgd;
      s.partition = stage == 1 ? PartitionStrategy::flat : PartitionStrategy::sorted_greedy;
      CAPTURE(per_node, stage);
      check_same_as_private(comm, s, per_node);
    }
  }
}

TEST_CASE("external storage syncs through node-shared staging bitwise as through collectives", "[node_sharing]") {
  for (int per_node : {0, 2}) {
    const std::shared_ptr<Communicator> comm = per_node == 0 ? world() : world_with_nodes_of(per_node);
    for (DType dtype : {DType::f32, DType::bf16}) {
      Setup s;
      s.external = true;
      s.dtype = dtype;
      s.partition = PartitionStrategy::sorted_greedy;
      CAPTURE(per_node, dtype_name(dtype));
      check_same_as_private(comm, s, per_node);
    }
  }
}

TEST_CASE("a node's ranks see one parameter buffer", "[node_sharing]") {
  Values values(5);
  auto opt = build(world(), Setup{}, true, values);
  const MemoryReport report = opt->memory_report();
  if (report.node_ranks < 2) return;  // one rank: nothing shared
  // Rank 0 writes between collective calls; after the next one, every rank reads it.
  const float marker = 1234.5f;
  if (world()->rank() == 0) opt->param_view(4).as<float>()[7] = marker;
  world()->barrier();
  CHECK(opt->param_view(4).as<float>()[7] == marker);
  // Private buffers stay private.
  Values other(5);
  auto own = build(world(), Setup{}, false, other);
  if (world()->rank() == 0) own->param_view(4).as<float>()[7] = marker;
  world()->barrier();
  CHECK((own->param_view(4).as<float>()[7] == marker) == (world()->rank() == 0));
}

TEST_CASE("a checkpoint loads into node-shared parameters as into private ones", "[node_sharing][checkpoint]") {
  const Setup s;
  Values a(21), b(21), c(21);
  auto source = build(world(), s, false, a);
  for (uint32_t k = 0; k < 2; ++k) step_once(*source, s, 40 + k);
  // One directory for every rank: rank 0 names it.
  std::string dir = (std::filesystem::temp_directory_path() / "shardopt-node-sharing-XXXXXX").string();
  if (world()->rank() == 0) REQUIRE(mkdtemp(dir.data()) != nullptr);
  world()->broadcast(dir.data(), static_cast<int64_t>(dir.size()), DType::byte, 0);
  source->save(dir);
  auto shared = build(world(), s, true, b);
  auto own = build(world(), s, false, c);
  shared->load(dir);
  own->load(dir);
  REQUIRE(param_bytes(*shared) == param_bytes(*source));
  step_once(*shared, s, 50);
  step_once(*own, s, 50);
  REQUIRE(param_bytes(*shared) == param_bytes(*own));
  world()->barrier();
  if (world()->rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("CommOptions.ranks_per_node must not be negative", "[node_sharing][errors]") {
  CommOptions options;
  options.ranks_per_node = -2;
  const auto [code, message] = shardopt_test::error_of([&] { mpi_world(options); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("CommOptions.ranks_per_node is -2"));
}
