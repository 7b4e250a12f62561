// tests/mpi/test_overlap.cpp — the overlapped step (after_backward, per_bucket) against the plain step, bitwise, over stages, partitions and dtypes; the bucket order agreement, refusals, wait_param, and Join with overlap.
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float <-> bf16 (nearest even)

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

// Several buckets of 64 f32 (128 bf16) elements, some params spanning two.
const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};
constexpr int kSteps = 4;

struct Setup {
  int stage = 1;
  PartitionStrategy partition = PartitionStrategy::flat;
  DType dtype = DType::f32;
  OverlapPolicy overlap = OverlapPolicy::after_backward;
  bool node_shared = false;
  bool shard_state = true;
  double clip = 0.0;
};

std::string describe(const Setup& s) {
  return "stage " + std::to_string(s.stage) + ", " + partition_name(s.partition) + ", " + dtype_name(s.dtype) + ", " +
         overlap_policy_name(s.overlap) + (s.node_shared ? ", node-shared" : "") + (s.shard_state ? "" : ", replicated") + (s.clip > 0 ? ", clipped" : "");
}

// This rank's gradient of param i at step `step`: different on every rank, not exactly summable.
std::vector<float> grad_of(int rank, int step, std::size_t param) {
  return shardopt_test::seeded_values(1000u + static_cast<uint32_t>(rank * 97 + step * 13) +
                                          static_cast<uint32_t>(param),
                                      kSizes[param]);
}

bool same(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

struct Model {
  shardopt_test::SeededParams params{kSizes, 5};
  std::vector<std::vector<uint16_t>> half;
  std::unique_ptr<ZeroOptimizer> opt;
  Setup s;

  Model(std::shared_ptr<Communicator> comm, const Setup& setup, OverlapPolicy overlap) : s(setup) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.partition = s.partition;
    config.stage = s.stage;
    config.bucket_bytes = 256;
    config.node_shared_params = s.node_shared;
    config.shard_state = s.shard_state;
    config.overlap = overlap;
    config.stochastic_rounding = s.dtype == DType::bf16;
    config.rounding_seed = 3;
    ParamGroupSpec group = params.all(shardopt_test::busy_hyperparams(Algorithm::adamw));
    if (s.dtype == DType::bf16) {
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        half.emplace_back();
        for (float x : params.values[i]) half.back().push_back(kernels::float_to_bf16(x));
      }
      for (std::size_t i = 0; i < kSizes.size(); ++i) group.params[i].param = TensorRef{half[i].data(), kSizes[i], DType::bf16};
    }
    opt = std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{group});
  }

  // The gradient as the param's dtype, in `storage` (kept alive by the caller).
  TensorRef as_grad(const std::vector<float>& g, std::vector<uint16_t>& storage) const {
    if (s.dtype == DType::f32) return TensorRef{const_cast<float*>(g.data()), static_cast<int64_t>(g.size())};
    storage.clear();
    for (float x : g) storage.push_back(kernels::float_to_bf16(x));
    return TensorRef{storage.data(), static_cast<int64_t>(storage.size()), DType::bf16};
  }

  void write_view(ParamId id, const TensorRef& g) {
    const TensorRef v = opt->grad_view(id);
    std::memcpy(v.data, g.data, g.nbytes());
  }

  // Plain: gradients in place (stage 1) or handed in backward order (stage 2), reduced, stepped.
  void plain_step(int step) {
    std::vector<uint16_t> storage;
    for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
      const std::vector<float> values = grad_of(world()->rank(), step, static_cast<std::size_t>(i));
      const TensorRef g = as_grad(values, storage);
      if (s.stage == 1) {
        write_view(i, g);
      } else {
        opt->reduce_gradient(i, g);
      }
    }
    opt->reduce_gradients();
    if (s.clip > 0) opt->clip_grad_norm(s.clip);
    opt->step();
  }

  // Overlapped: handed in backward order (stage 1 alternates grad_ready and reduce_gradient).
  void overlapped_step(int step, bool forward_order = false) {
    std::vector<uint16_t> storage;
    const int n = static_cast<int>(kSizes.size());
    for (int k = 0; k < n; ++k) {
      const int i = forward_order ? k : n - 1 - k;
      const std::vector<float> values = grad_of(world()->rank(), step, static_cast<std::size_t>(i));
      const TensorRef g = as_grad(values, storage);
      if (s.stage == 1 && i % 2 == 0) {
        write_view(i, g);
        opt->grad_ready(i);
      } else {
        opt->reduce_gradient(i, g);
      }
    }
    opt->reduce_gradients();
    if (s.clip > 0) opt->clip_grad_norm(s.clip);
    opt->step();
  }

  std::vector<uint8_t> bytes() { return shardopt_test::param_bytes(*opt); }
};

}  // namespace

TEST_CASE("the overlapped step equals the plain step bitwise", "[overlap]") {
  std::vector<Setup> setups;
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
          Setup s;
          s.stage = stage;
          s.partition = partition;
          s.dtype = dtype;
          s.overlap = overlap;
          setups.push_back(s);
        }
      }
    }
  }
  for (int stage : {1, 2}) {
    Setup clipped;
    clipped.stage = stage;
    clipped.clip = 0.05;
    setups.push_back(clipped);
    for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
      Setup shared;
      shared.stage = stage;
      shared.overlap = overlap;
      shared.node_shared = true;
      setups.push_back(shared);
    }
  }
  for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
    Setup replicated;
    replicated.overlap = overlap;
    replicated.shard_state = false;
    setups.push_back(replicated);
  }
  for (const Setup& s : setups) {
    INFO(describe(s));
    Model plain(world(), s, OverlapPolicy::off);
    Model overlapped(world(), s, s.overlap);
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step);
      plain.plain_step(step);
      overlapped.overlapped_step(step);
      const std::vector<uint8_t> expected = plain.bytes();
      const std::vector<uint8_t> got = overlapped.bytes();
      REQUIRE(got.size() == expected.size());
      CHECK(std::memcmp(got.data(), expected.data(), got.size()) == 0);
      // The step changed the parameters (a test that cannot fail would not).
      if (step == 0) {
        Model fresh(world(), s, OverlapPolicy::off);
        CHECK(std::memcmp(got.data(), fresh.bytes().data(), got.size()) != 0);
      }
    }
    overlapped.opt->wait_all();
    CHECK(overlapped.opt->last_step().grad_norm == plain.opt->last_step().grad_norm);
  }
}

TEST_CASE("a rank that completes buckets in another order gets the named mismatch on every rank", "[overlap]") {
  if (world()->size() < 2) return;
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    Setup s;
    s.stage = stage;
    Model plain(world(), s, OverlapPolicy::off);
    Model m(world(), s, OverlapPolicy::after_backward);
    const bool odd_one = world()->rank() == 1;
    // The first round: nothing is issued before the ranks agree on the order.
    auto [code, what] = error_of([&] { m.overlapped_step(0, /*forward_order=*/odd_one); });
    CHECK(code == ErrorCode::mismatch);
    CHECK_THAT(what, Catch::Contains("reduce_gradients") && Catch::Contains("bucket hand-over order") &&
                         Catch::Contains("rank 1 has buckets completed in the order 0,"));
    // The optimizer goes on: the next round learns the order, and training matches the plain run.
    // (The plain model shares the world communicator: it steps while `m` has nothing in flight.)
    plain.plain_step(1);
    m.overlapped_step(1);
    CHECK(same(m.bytes(), plain.bytes()));
    // Learned: buckets are issued in that order whatever the hand-over, so nothing hangs, and
    // the order check still names the rank that changed it.
    auto [code2, what2] = error_of([&] { m.overlapped_step(2, /*forward_order=*/odd_one); });
    CHECK(code2 == ErrorCode::mismatch);
    CHECK_THAT(what2, Catch::Contains("bucket hand-over order") && Catch::Contains("rank 1 has"));
    plain.plain_step(3);
    m.overlapped_step(3);
    CHECK(same(m.bytes(), plain.bytes()));
  }
}

TEST_CASE("overlap refusals: per_bucket with clipping, loss scaling or params sitting out; external storage",
          "[overlap]") {
  Setup s;
  s.overlap = OverlapPolicy::per_bucket;
  Model m(world(), s, OverlapPolicy::per_bucket);
  m.overlapped_step(0);
  std::vector<uint16_t> storage;
  for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
    const std::vector<float> values = grad_of(world()->rank(), 1, static_cast<std::size_t>(i));
    m.opt->reduce_gradient(i, m.as_grad(values, storage));
  }
  m.opt->reduce_gradients();
  auto [code, what] = error_of([&] { m.opt->clip_grad_norm(1.0); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(what, Catch::Contains("per_bucket") && Catch::Contains("clip"));
  auto [code_out, what_out] = error_of([&] { m.opt->step(std::vector<ParamId>{1}); });
  CHECK(code_out == ErrorCode::invalid_argument);
  CHECK_THAT(what_out, Catch::Contains("per_bucket") && Catch::Contains("sit a step out"));
  m.opt->step();  // the round's updates are taken in

  OptimizerConfig scaled;
  scaled.overlap = OverlapPolicy::per_bucket;
  scaled.loss_scaling.enabled = true;
  shardopt_test::SeededParams params{kSizes, 5};
  auto [code_ls, what_ls] = error_of([&] { ZeroOptimizer(world(), scaled, {params.all()}); });
  CHECK(code_ls == ErrorCode::invalid_argument);
  CHECK_THAT(what_ls, Catch::Contains("per_bucket") && Catch::Contains("loss scaling"));

  OptimizerConfig external;
  external.overlap = OverlapPolicy::after_backward;
  external.storage = Storage::external;
  auto [code_ext, what_ext] = error_of([&] { ZeroOptimizer(world(), external, {params.all({}, true)}); });
  CHECK(code_ext == ErrorCode::invalid_argument);
  CHECK_THAT(what_ext, Catch::Contains("config.overlap = after_backward needs storage = bucket_view"));
}

TEST_CASE("overlap argument errors: grad_ready at stage 2, a second hand-over, a round before per_bucket's step",
          "[overlap]") {
  Setup s2;
  s2.stage = 2;
  Model stage2(world(), s2, OverlapPolicy::after_backward);
  auto [code, what] = error_of([&] { stage2.opt->grad_ready(0); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(what, Catch::Contains("grad_ready('p0')") && Catch::Contains("at stage 2"));

  Setup s;
  s.overlap = OverlapPolicy::per_bucket;
  Model m(world(), s, OverlapPolicy::per_bucket);
  m.opt->grad_ready(5);
  auto [code2, what2] = error_of([&] { m.opt->grad_ready(5); });
  CHECK(code2 == ErrorCode::invalid_argument);
  CHECK_THAT(what2, Catch::Contains("the gradient of 'p5' was already handed in this round"));
  for (ParamId id = 4; id >= 0; --id) m.opt->grad_ready(id);
  m.opt->reduce_gradients();
  // The buckets were updated as they landed: the next round may not open before step().
  auto [code3, what3] = error_of([&] { m.opt->grad_ready(5); });
  CHECK(code3 == ErrorCode::invalid_argument);
  CHECK_THAT(what3, Catch::StartsWith("reduce_gradient: ") && Catch::Contains("already updated this round's buckets") &&
                        Catch::Contains("call step() first"));
  m.opt->step();
  m.opt->wait_all();
}

TEST_CASE("a layout change makes the ranks learn the bucket order anew", "[overlap]") {
  Setup s;
  Model plain(world(), s, OverlapPolicy::off);
  Model m(world(), s, OverlapPolicy::after_backward);
  plain.plain_step(0);
  m.overlapped_step(0);  // learns the backward order
  CHECK(same(m.bytes(), plain.bytes()));
  plain.opt->set_trainable(3, false);
  m.opt->set_trainable(3, false);
  // Every rank now hands in forward order: agreed anew, no mismatch.
  std::vector<uint16_t> unused;
  for (int step = 1; step < 3; ++step) {
    // (The plain model shares the world communicator: it steps while `m` has nothing in flight.)
    for (ParamId id = 0; id < static_cast<ParamId>(kSizes.size()); ++id) {
      if (id == 3) continue;
      const std::vector<float> values = grad_of(world()->rank(), step, static_cast<std::size_t>(id));
      plain.write_view(id, plain.as_grad(values, unused));
    }
    plain.opt->reduce_gradients();
    plain.opt->step();
    for (ParamId id = 0; id < static_cast<ParamId>(kSizes.size()); ++id) {
      if (id == 3) continue;
      const std::vector<float> values = grad_of(world()->rank(), step, static_cast<std::size_t>(id));
      m.write_view(id, m.as_grad(values, unused));
      m.opt->grad_ready(id);
    }
    m.opt->reduce_gradients();
    m.opt->step();
    CHECK(same(m.bytes(), plain.bytes()));
  }
}

TEST_CASE("config.overlap is agreed like every config field", "[overlap]") {
  if (world()->size() < 2) return;
  OptimizerConfig config;
  config.overlap = world()->rank() == 1 ? OverlapPolicy::per_bucket : OverlapPolicy::after_backward;
  shardopt_test::SeededParams params{kSizes, 5};
  auto [code, what] = error_of([&] { ZeroOptimizer(world(), config, {params.all()}); });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(what, Catch::Contains("config.overlap") && Catch::Contains("rank 0 has after_backward") &&
                       Catch::Contains("rank 1 has per_bucket"));
}

TEST_CASE("wait_param, wait_bucket and wait_all", "[overlap]") {
  Setup s;
  Model plain(world(), s, OverlapPolicy::off);
  Model m(world(), s, OverlapPolicy::after_backward);
  const int buckets = m.opt->num_buckets();
  // Flat layout of 325 elements padded to world*16: 64-element buckets.
  int64_t total = 0;
  for (int64_t n : kSizes) total += n;
  const int64_t align = 16 * world()->size();
  CHECK(buckets == static_cast<int>(((total + align - 1) / align * align + 63) / 64));
  CHECK(plain.opt->num_buckets() == buckets);
  auto [code, what] = error_of([&] { m.opt->wait_bucket(buckets); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(what, Catch::Contains("wait_bucket: bucket " + std::to_string(buckets) + " is out of range"));
  auto [code_id, what_id] = error_of([&] { m.opt->wait_param(static_cast<ParamId>(kSizes.size())); });
  CHECK(code_id == ErrorCode::invalid_argument);
  // Without overlap step() synced everything: the waits return at once.
  plain.plain_step(0);
  plain.opt->wait_param(0);
  plain.opt->wait_bucket(0);
  plain.opt->wait_all();
  m.overlapped_step(0);
  // Bucket by bucket in forward order, then the params: each equal to the plain step's.
  for (int b = 0; b < buckets; ++b) m.opt->wait_bucket(b);
  CHECK(same(m.bytes(), plain.bytes()));
  // After wait_all the communicator is free for the caller's own collectives.
  m.opt->wait_all();
  float one = 1.f;
  world()->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  CHECK(one == static_cast<float>(world()->size()));
}

TEST_CASE("consolidate_state_dict works from the first overlapped step and equals the plain state", "[overlap]") {
  // torch's overlap_with_ddp cannot consolidate until DDP has rebuilt its buckets; here the
  // state after step 1 is there at once, for both policies and both stages.
  for (OverlapPolicy policy : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
    for (int stage : {1, 2}) {
      Setup s;
      s.stage = stage;
      s.overlap = policy;
      INFO(describe(s));
      Model plain(world(), s, OverlapPolicy::off);
      Model m(world(), s, policy);
      // m's consolidation first: it waits for m's queued all-gathers, after which the plain
      // optimizer may use the same communicator (optimizer.hpp: OptimizerConfig::overlap).
      m.overlapped_step(0);
      m.opt->consolidate_state_dict(0);
      plain.plain_step(0);
      plain.opt->consolidate_state_dict(0);
      if (world()->rank() != 0) continue;
      const StateDict want = plain.opt->state_dict();
      const StateDict got = m.opt->state_dict();
      CHECK(got.param_names == want.param_names);
      REQUIRE(got.state.size() == want.state.size());
      REQUIRE(got.state.size() == kSizes.size());
      for (const auto& [id, state] : want.state) {
        const ParamState& other = got.state.at(id);
        CHECK(other.step == 1);
        CHECK(other.step == state.step);
        REQUIRE(other.tensors.size() == state.tensors.size());
        for (const auto& [kind, values] : state.tensors) {
          const std::vector<float>& o = other.tensors.at(kind);
          REQUIRE(o.size() == values.size());
          CHECK(std::memcmp(o.data(), values.data(), values.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

namespace {

int batches_of(int rank) { return 3 + 2 * rank; }  // np 3: 3, 5 and 7

std::vector<uint8_t> train_uneven(const Setup& s, OverlapPolicy overlap) {
  Model m(world(), s, overlap);
  for (int b = 0; b < batches_of(world()->rank()); ++b) {
    if (overlap == OverlapPolicy::off) {
      m.plain_step(b);
    } else {
      m.overlapped_step(b);
    }
  }
  m.opt->join();
  m.opt->consolidate_state_dict(0);
  return m.bytes();
}

}  // namespace

TEST_CASE("join() with overlap equals join() without", "[overlap][join]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
        Setup s;
        s.stage = stage;
        s.partition = partition;
        s.overlap = overlap;
        INFO(describe(s));
        const std::vector<uint8_t> expected = train_uneven(s, OverlapPolicy::off);
        const std::vector<uint8_t> got = train_uneven(s, overlap);
        CHECK(same(got, expected));
      }
    }
  }
}
