// tests/mpi/test_node_reduce.cpp — stage 1's gradient average on one node through node-shared gradient slots: bitwise the MPI path's average and steps, on every dtype and partition, on one node and on several (CommOptions.ranks_per_node), where the MPI path stays.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float -> bf16/f16, nearest even

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {1000, 3, 517, 64, 2049, 1};

std::shared_ptr<Communicator> world_with_nodes_of(int ranks_per_node) {
  CommOptions options;
  options.timeout_seconds = 60;
  options.ranks_per_node = ranks_per_node;
  return mpi_world(options);
}

std::unique_ptr<ZeroOptimizer> build(const std::shared_ptr<Communicator>& comm, DType dtype,
                                     PartitionStrategy partition, bool shared) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = partition;
  config.node_shared_params = shared;
  config.bucket_bytes = 1024;  // the MPI path: several buckets per shard
  ParamGroupSpec group;
  group.hyper = shardopt_test::busy_hyperparams(Algorithm::adamw);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{nullptr, kSizes[i], dtype, Device::cpu()};  // shardopt's zeros
    group.params.push_back(p);
  }
  return std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
}

// This rank's gradients for round `round`: different on every rank and inexact to sum, so the
// summation order shows in the bits.
void write_gradients(ZeroOptimizer& opt, DType dtype, int rank, uint32_t round) {
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef g = opt.grad_view(id);
    const std::vector<float> values =
        shardopt_test::seeded_values(1000u * round + 37u * static_cast<uint32_t>(rank) + static_cast<uint32_t>(id), g.numel);
    for (int64_t i = 0; i < g.numel; ++i) {
      if (dtype == DType::f32) {
        static_cast<float*>(g.data)[i] = values[static_cast<std::size_t>(i)];
      } else {
        const float x = values[static_cast<std::size_t>(i)];
        static_cast<uint16_t*>(g.data)[i] = dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x);
      }
    }
  }
}

std::vector<uint8_t> view_bytes(const ZeroOptimizer& opt, bool grads) {
  std::vector<uint8_t> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = grads ? opt.grad_view(id) : opt.param_view(id);
    const auto* p = static_cast<const uint8_t*>(v.data);
    out.insert(out.end(), p, p + v.nbytes());
  }
  return out;
}

// Whether `address` lies in a shared mapping of a shardopt node-shared segment (/dev/shm).
bool in_node_shared_segment(const void* address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(address);
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (at >= lo && at < hi) return perms[3] == 's' && line.find("/shardopt-") != std::string::npos;
  }
  return false;
}

// Nodes of `per_node` consecutive ranks (0: one node of all).
int node_count(int per_node) {
  const int n = world()->size();
  return per_node == 0 ? 1 : (n + per_node - 1) / per_node;
}

}  // namespace

TEST_CASE("on one node and on nodes of equal size the gradients live in node-shared slots; across uneven nodes in "
          "each rank's own memory",
          "[node_sharing][node_reduce]") {
  for (int per_node : {0, 2}) {
    CAPTURE(per_node);
    const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
    auto shared = build(comm, DType::f32, PartitionStrategy::flat, true);
    auto own = build(comm, DType::f32, PartitionStrategy::flat, false);
    // Across nodes of equal size too (the hierarchical reduction), not across uneven ones.
    const bool expected = comm->size() > 1 && (node_count(per_node) == 1 || comm->size() % per_node == 0);
    CHECK(in_node_shared_segment(shared->grad_view(0).data) == expected);
    CHECK_FALSE(in_node_shared_segment(own->grad_view(0).data));
  }
}

TEST_CASE("node-shared gradient slots average bitwise as the MPI all-reduce, then step alike",
          "[node_sharing][node_reduce]") {
  for (int per_node : {0, 2}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
        CAPTURE(per_node, static_cast<int>(dtype), static_cast<int>(partition));
        const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
        auto shared = build(comm, dtype, partition, true);
        auto own = build(comm, dtype, partition, false);
        for (uint32_t round = 1; round <= 3; ++round) {
          write_gradients(*shared, dtype, comm->rank(), round);
          write_gradients(*own, dtype, comm->rank(), round);
          shared->reduce_gradients();
          own->reduce_gradients();
          REQUIRE(view_bytes(*shared, true) == view_bytes(*own, true));
          shared->step();
          own->step();
          REQUIRE(view_bytes(*shared, false) == view_bytes(*own, false));
        }
        // A layout change rebuilds the slots; the next rounds still agree.
        shared->set_trainable(2, false);
        own->set_trainable(2, false);
        write_gradients(*shared, dtype, comm->rank(), 9);
        write_gradients(*own, dtype, comm->rank(), 9);
        shared->reduce_gradients();
        own->reduce_gradients();
        REQUIRE(view_bytes(*shared, true) == view_bytes(*own, true));
        shared->step();
        own->step();
        REQUIRE(view_bytes(*shared, false) == view_bytes(*own, false));
      }
    }
  }
}

TEST_CASE("identical gradients on every rank average to themselves through the slots at 1, 2 and 4 ranks",
          "[node_sharing][node_reduce]") {
  // Powers of two: every partial sum of the tree is exact (x + x, 2x + 2x), so N ranks reduce to
  // exactly what one rank holds, as the single-rank reference of the other tests assumes.
  const int n = world()->size();
  if (n == 3) return;
  auto opt = build(world(), DType::f32, PartitionStrategy::flat, true);
  write_gradients(*opt, DType::f32, 0, 5);
  const std::vector<uint8_t> before = view_bytes(*opt, true);
  opt->reduce_gradients();
  REQUIRE(view_bytes(*opt, true) == before);
}
