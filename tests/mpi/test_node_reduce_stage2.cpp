// tests/mpi/test_node_reduce_stage2.cpp — stage 2 (bucket view and external storage) and external storage at stage 1, on one node through the node-shared gradient slots: steps bitwise stage 1's through the slots, and MPI's where that matched before.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float -> bf16/f16, nearest even

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {1000, 3, 517, 64, 2049, 1};

// How a stage-2 bucket-view run gives its gradients: handed with reduce_gradient() from the
// caller's buffers, written through grad_view() and read in place by reduce_gradients(), or
// written through grad_view() and handed from there (no copy).
enum class Grads { handed, views_in_place, views_handed };

struct Run {
  int stage = 1;
  Storage storage = Storage::bucket_view;
  Grads grads_by = Grads::handed;
  std::vector<std::vector<uint8_t>> params, grads;  // external storage: the caller's buffers
  std::unique_ptr<ZeroOptimizer> opt;
};

// Whether the ranks get node-shared gradient slots (no overlap): one node of several ranks, or
// nodes of `per_node` consecutive ranks each, all of equal size (the hierarchical reduction).
bool slots_expected(int n, int per_node) {
  return n > 1 && (per_node == 0 || n <= per_node || (per_node >= 2 && n % per_node == 0));
}

std::shared_ptr<Communicator> world_with_nodes_of(int ranks_per_node) {
  CommOptions options;
  options.timeout_seconds = 30;
  options.ranks_per_node = ranks_per_node;
  return mpi_world(options);
}

Run build(const std::shared_ptr<Communicator>& comm, DType dtype, PartitionStrategy partition, int stage,
          Storage storage, bool shared) {
  Run run;
  run.stage = stage;
  run.storage = storage;
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = partition;
  config.stage = stage;
  config.storage = storage;
  config.node_shared_params = shared;
  config.bucket_bytes = 1024;  // the MPI path: several buckets per shard
  ParamGroupSpec group;
  group.hyper = shardopt_test::busy_hyperparams(Algorithm::adamw);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    run.params.emplace_back(static_cast<std::size_t>(kSizes[i]) * dtype_size(dtype), uint8_t{0});
    run.grads.emplace_back(static_cast<std::size_t>(kSizes[i]) * dtype_size(dtype), uint8_t{0});
  }
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    const bool external = storage == Storage::external;
    p.param = TensorRef{external ? run.params[i].data() : nullptr, kSizes[i], dtype, Device::cpu()};
    if (external) p.grad = TensorRef{run.grads[i].data(), kSizes[i], dtype, Device::cpu()};
    group.params.push_back(p);
  }
  run.opt = std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
  return run;
}

// This rank's gradient of param `id` in round `round`: different on every rank and inexact to
// sum, so the summation order shows in the bits.
std::vector<uint8_t> gradient(DType dtype, int rank, uint32_t round, ParamId id) {
  const int64_t n = kSizes[static_cast<std::size_t>(id)];
  const std::vector<float> values =
      shardopt_test::seeded_values(1000u * round + 37u * static_cast<uint32_t>(rank) + static_cast<uint32_t>(id), n);
  std::vector<uint8_t> out(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = values[static_cast<std::size_t>(i)];
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// One round: every gradient handed the way its stage and storage take it, averaged, stepped.
void train_round(Run& run, DType dtype, int rank, uint32_t round) {
  ZeroOptimizer& opt = *run.opt;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    if (!opt.trainable(id)) continue;
    std::vector<uint8_t> g = gradient(dtype, rank, round, id);
    if (run.storage == Storage::external) {
      run.grads[static_cast<std::size_t>(id)] = g;  // same size: the registered buffer stays put
    } else if (run.stage == 2 && run.grads_by != Grads::handed) {
      const TensorRef view = opt.grad_view(id);
      std::memcpy(view.data, g.data(), g.size());
      if (run.grads_by == Grads::views_handed) opt.reduce_gradient(id, view);
    } else if (run.stage == 2) {
      opt.reduce_gradient(id, TensorRef{g.data(), kSizes[static_cast<std::size_t>(id)], dtype, Device::cpu()});
    } else {
      std::memcpy(opt.grad_view(id).data, g.data(), g.size());
    }
  }
  opt.reduce_gradients();
  opt.step();
}

std::vector<uint8_t> param_bytes(const Run& run) {
  std::vector<uint8_t> out;
  for (ParamId id = 0; id < run.opt->num_params(); ++id) {
    if (run.storage == Storage::external) {
      const std::vector<uint8_t>& p = run.params[static_cast<std::size_t>(id)];
      out.insert(out.end(), p.begin(), p.end());
    } else {
      const TensorRef v = run.opt->param_view(id);
      const auto* p = static_cast<const uint8_t*>(v.data);
      out.insert(out.end(), p, p + v.nbytes());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("stage 2 and external storage on one node, or on nodes of equal size, stage their hand-over in a "
          "node-shared slot per rank; across uneven nodes they do not",
          "[node_sharing][node_reduce]") {
  for (int per_node : {0, 2}) {
    for (int stage : {1, 2}) {
      const Storage storage = stage == 1 ? Storage::external : Storage::bucket_view;
      CAPTURE(per_node, stage, static_cast<int>(storage));
      const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
      const Run shared = build(comm, DType::f32, PartitionStrategy::flat, stage, storage, true);
      const Run own = build(comm, DType::f32, PartitionStrategy::flat, stage, storage, false);
      const int n = comm->size();
      const bool one_node = slots_expected(n, per_node);
      const int64_t trainable_bytes = shared.opt->memory_report().trainable_numel * 4;
      // External storage: the slot holds every trainable element; the MPI path's staging stays
      // at a few buckets. Stage 2 with bucket view: the slot is the gradient buffer itself (see
      // the grad views case), no staging.
      if (storage == Storage::external) CHECK((shared.opt->memory_report().buffer_bytes >= trainable_bytes) == one_node);
      if (storage == Storage::bucket_view && one_node) CHECK(shared.opt->memory_report().buffer_bytes == 0);
      // (External storage's own sync staging is a whole buffer; bucket view's MPI staging is not.)
      if (storage == Storage::bucket_view) CHECK(own.opt->memory_report().buffer_bytes < trainable_bytes);
      // External stage 2 as well (its buffers are the same as stage 1's external ones).
      if (stage == 1) {
        const Run external2 = build(comm, DType::f32, PartitionStrategy::flat, 2, Storage::external, true);
        CHECK((external2.opt->memory_report().buffer_bytes >= trainable_bytes) == one_node);
      }
    }
  }
}

TEST_CASE("stage 2 and external storage through the node's slots step bitwise as stage 1 with bucket view, and "
          "as through MPI at 1-2 ranks",
          "[node_sharing][node_reduce]") {
  const int n = world()->size();
  for (int per_node : {0, 2}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
        CAPTURE(per_node, static_cast<int>(dtype), static_cast<int>(partition));
        const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
        Run stage1 = build(comm, dtype, partition, 1, Storage::bucket_view, true);
        Run view = build(comm, dtype, partition, 2, Storage::bucket_view, true);
        Run external = build(comm, dtype, partition, 2, Storage::external, true);
        Run external1 = build(comm, dtype, partition, 1, Storage::external, true);
        Run through_mpi = build(comm, dtype, partition, 2, Storage::bucket_view, false);
        Run external1_mpi = build(comm, dtype, partition, 1, Storage::external, false);
        const std::vector<Run*> runs = {&stage1, &view, &external, &external1, &through_mpi, &external1_mpi};
        for (uint32_t round = 1; round <= 4; ++round) {
          if (round == 4) {
            // A layout change rebuilds the slots; the next round still agrees.
            for (Run* run : runs) run->opt->set_trainable(2, false);
          }
          for (Run* run : runs) train_round(*run, dtype, comm->rank(), round);
          const std::vector<uint8_t> expected = param_bytes(stage1);
          REQUIRE(param_bytes(view) == expected);
          REQUIRE(param_bytes(external) == expected);
          REQUIRE(param_bytes(external1) == expected);
          // External storage at stage 1 hands the average back to the caller's buffers: the same
          // bytes as through MPI's all-reduce (stage 1's order on one node).
          REQUIRE(external1.grads == external1_mpi.grads);
          REQUIRE(param_bytes(external1_mpi) == expected);
          // At 3+ ranks MPI's reduce (stage 2's path across nodes) may associate the sum
          // differently from the binomial all-reduce, so only 1-2 ranks are compared there.
          if (n <= 2) REQUIRE(param_bytes(through_mpi) == expected);
        }
      }
    }
  }
}

TEST_CASE("stage 2 with bucket view on one node: the backward writes its node-shared slot through grad_view, no "
          "hand-over copy and no buffer beside the gradients (also on nodes of equal size); refused by name across "
          "uneven nodes and at one rank",
          "[node_sharing][node_reduce]") {
  const int n = world()->size();
  for (int per_node : {0, 2}) {
    CAPTURE(per_node);
    const std::shared_ptr<Communicator> comm = world_with_nodes_of(per_node);
    const bool one_node = slots_expected(n, per_node);
    Run stage1 = build(comm, DType::f32, PartitionStrategy::flat, 1, Storage::bucket_view, true);
    Run views = build(comm, DType::f32, PartitionStrategy::flat, 2, Storage::bucket_view, true);
    Run own = build(comm, DType::f32, PartitionStrategy::flat, 2, Storage::bucket_view, false);
    const MemoryReport m1 = stage1.opt->memory_report();
    const MemoryReport m2 = views.opt->memory_report();
    const MemoryReport mine = own.opt->memory_report();
    if (!one_node) {
      // Every rank refuses alike, naming where the views exist.
      try {
        views.opt->grad_view(0);
        FAIL("grad_view at stage 2 was not refused");
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::invalid_argument);
        CHECK(std::string(e.what()).find("a whole gradient buffer only with node-shared parameters, on one node or") !=
              std::string::npos);
      }
      CHECK(m2.grad_bytes == mine.grad_bytes);
      continue;
    }
    // On one node exactly stage 1's gradient slot, and nothing beside: the shard's average is
    // summed in place into the slot's positions of this rank's shard. Across nodes of equal size
    // the hierarchical reduction copies the shard out of the slot into a buffer of its own, the
    // size an unshared rank keeps.
    const bool across_nodes = per_node > 0 && n > per_node;
    CHECK(m2.grad_bytes == m1.grad_bytes + (across_nodes ? mine.grad_bytes : 0));
    CHECK(mine.grad_bytes > 0);
    CHECK(m2.buffer_bytes == 0);
    CHECK(m1.buffer_bytes == 0);
    // The view is the slot: stage 1's view of the same param sits at the same offset of its own slot.
    CHECK(views.opt->grad_view(4).numel == kSizes[4]);
    CHECK(static_cast<char*>(views.opt->grad_view(4).data) - static_cast<char*>(views.opt->grad_view(0).data) ==
          static_cast<char*>(stage1.opt->grad_view(4).data) - static_cast<char*>(stage1.opt->grad_view(0).data));
    // zero_grad() clears the slot, as at stage 1.
    std::memset(views.opt->grad_view(2).data, 0x3f, static_cast<std::size_t>(kSizes[2]) * 4);
    views.opt->zero_grad();
    const auto* cleared = static_cast<const uint8_t*>(views.opt->grad_view(2).data);
    CHECK(std::all_of(cleared, cleared + kSizes[2] * 4, [](uint8_t b) { return b == 0; }));
  }
}

TEST_CASE("stage 2 through grad_view (read in place, or handed from the view) steps bitwise as stage 1 and as the "
          "hand-over copy; mixing the two ways across ranks is a named mismatch on every rank",
          "[node_sharing][node_reduce]") {
  const int n = world()->size();
  if (n < 2) return;  // one rank: no node sharing, so no stage-2 views (the case above checks the refusal)
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      CAPTURE(static_cast<int>(dtype), static_cast<int>(partition));
      const std::shared_ptr<Communicator> comm = world_with_nodes_of(0);
      Run stage1 = build(comm, dtype, partition, 1, Storage::bucket_view, true);
      Run handed = build(comm, dtype, partition, 2, Storage::bucket_view, true);
      Run in_place = build(comm, dtype, partition, 2, Storage::bucket_view, true);
      in_place.grads_by = Grads::views_in_place;
      Run from_view = build(comm, dtype, partition, 2, Storage::bucket_view, true);
      from_view.grads_by = Grads::views_handed;
      const std::vector<Run*> runs = {&stage1, &handed, &in_place, &from_view};
      for (uint32_t round = 1; round <= 4; ++round) {
        if (round == 4) {
          for (Run* run : runs) run->opt->set_trainable(2, false);
        }
        for (Run* run : runs) train_round(*run, dtype, comm->rank(), round);
        const std::vector<uint8_t> expected = param_bytes(stage1);
        REQUIRE(param_bytes(handed) == expected);
        REQUIRE(param_bytes(in_place) == expected);
        REQUIRE(param_bytes(from_view) == expected);
      }
    }
  }
  // Rank 0 hands every gradient, the others read theirs in place: refused on every rank (the
  // first hand-over's agreement meets the others' reduce_gradients()).
  const std::shared_ptr<Communicator> comm = world_with_nodes_of(0);
  Run mixed = build(comm, DType::f32, PartitionStrategy::flat, 2, Storage::bucket_view, true);
  mixed.grads_by = comm->rank() == 0 ? Grads::views_handed : Grads::views_in_place;
  try {
    train_round(mixed, DType::f32, comm->rank(), 1);
    FAIL("a round handed on one rank and read in place on another was not refused");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::mismatch);
    CAPTURE(e.what());
    CHECK(std::string(e.what()).find("ranks are in different calls: rank 0 is in reduce_gradient(), rank 1 is in "
                                     "reduce_gradients()") != std::string::npos);
  }
}
