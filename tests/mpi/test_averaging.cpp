// tests/mpi/test_averaging.cpp — model averaging and post-local SGD against a one-process replay of every replica, resumes from mid-period checkpoints, and the errors of ranks and configs that disagree.
//
// The replay runs every replica of the world in this process as a one-rank optimizer: during
// warmup each replica's gradient is the world's average (across replicas, then within one, as
// PostLocalSGDOptimizer averages), after it the replica's own; averaging divides each replica's
// values by the group's replica count and sums them in replica order, as torch does. Sums of
// two terms do not depend on their order, so runs whose every average has at most two terms
// must match bitwise; with more, MPI may associate differently, and the match is to rounding.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "averaging_runs.hpp"

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;
using namespace averaging_runs;

namespace {

int level_of(const AveragerConfig& c, int64_t step) {
  if (step < c.warmup_steps) return -1;
  if (!c.hierarchical) return (step - c.warmup_steps) % c.levels[0].period == 0 ? 0 : -1;
  for (std::size_t i = c.levels.size(); i-- > 0;) {
    if (step % c.levels[i].period == 0) return static_cast<int>(i);
  }
  return -1;
}

// The replay (f32): every replica's params after every step.
std::vector<std::vector<std::vector<float>>> replay(const Scenario& s, int steps = kSteps) {
  const int W = world()->size();
  const int L = s.replica_size;
  const int K = W / L;
  std::shared_ptr<Communicator> self = world()->split(world()->rank(), 0);
  Scenario one = s;
  one.stage = 1;  // one rank: the stages compute the same; stage 1 lets the replay write grad_view
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int k = 0; k < K; ++k) replicas.push_back(std::make_unique<Replica>(self, one));
  std::vector<float> anchor = params_of(*replicas[0]->opt), momentum(anchor.size(), 0.f);
  int64_t outer_steps = 0;
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(K));
  for (int t = 0; t < steps; ++t) {
    for (int k = 0; k < K; ++k) {
      ZeroOptimizer& opt = *replicas[static_cast<std::size_t>(k)]->opt;
      for (std::size_t id = 0; id < kSizes.size(); ++id) {
        std::vector<float> sum(static_cast<std::size_t>(kSizes[id]), 0.f);
        for (int l = 0; l < L; ++l) {
          std::vector<float> g = local_grad(k * L + l, t, id);
          if (t < s.averaging.warmup_steps && K > 1) {  // across the replicas first
            std::vector<float> cross(g.size(), 0.f);
            for (int j = 0; j < K; ++j) {
              const std::vector<float> gj = local_grad(j * L + l, t, id);
              for (std::size_t i = 0; i < g.size(); ++i) cross[i] = j == 0 ? gj[i] : cross[i] + gj[i];
            }
            for (std::size_t i = 0; i < g.size(); ++i) g[i] = cross[i] / static_cast<float>(K);
          }
          for (std::size_t i = 0; i < g.size(); ++i) sum[i] = l == 0 ? g[i] : sum[i] + g[i];
        }
        float* view = opt.grad_view(static_cast<ParamId>(id)).as<float>();
        for (std::size_t i = 0; i < sum.size(); ++i) view[i] = L == 1 ? sum[i] : sum[i] / static_cast<float>(L);
      }
      opt.step();
    }
    const int level = level_of(s.averaging, t);
    if (level >= 0) {
      const int group = s.averaging.levels[static_cast<std::size_t>(level)].group_size == 0
                            ? W
                            : s.averaging.levels[static_cast<std::size_t>(level)].group_size;
      const int m = group / L;
      const bool outer = s.averaging.outer.enabled && level + 1 == static_cast<int>(s.averaging.levels.size());
      for (int first = 0; first < K; first += m) {
        std::vector<float> avg;
        for (int k = first; k < first + m; ++k) {
          const std::vector<float> x = params_of(*replicas[static_cast<std::size_t>(k)]->opt);
          if (avg.empty()) avg.assign(x.size(), 0.f);
          for (std::size_t i = 0; i < x.size(); ++i) avg[i] = k == first ? x[i] / m : avg[i] + x[i] / m;
        }
        if (outer) {  // torch's SGD on the anchor, the pseudo-gradient anchor - average
          const OuterOptimizer& o = s.averaging.outer;
          const float mu = static_cast<float>(o.momentum), lr = static_cast<float>(o.lr);
          for (std::size_t i = 0; i < avg.size(); ++i) {
            float d = anchor[i] - avg[i];
            const float b = outer_steps == 0 ? d : momentum[i] * mu + 1.0f * d;
            momentum[i] = b;
            d = o.nesterov ? d + mu * b : b;
            anchor[i] = anchor[i] + (-lr) * d;
          }
          ++outer_steps;
          avg = anchor;
        }
        for (int k = first; k < first + m; ++k) {
          ZeroOptimizer& opt = *replicas[static_cast<std::size_t>(k)]->opt;
          std::size_t at = 0;
          for (ParamId id = 0; id < opt.num_params(); ++id) {
            const TensorRef v = opt.param_view(id);
            std::memcpy(v.data, avg.data() + at, v.nbytes());
            at += static_cast<std::size_t>(v.numel);
          }
        }
      }
    }
    if (s.averaging.outer.enabled && t + 1 == s.averaging.warmup_steps) anchor = params_of(*replicas[0]->opt);
    for (int k = 0; k < K; ++k) out[static_cast<std::size_t>(k)].push_back(params_of(*replicas[static_cast<std::size_t>(k)]->opt));
  }
  return out;
}

// Whether every average the scenario takes has at most two terms (replicas, and ranks of one).
bool pairwise_only(const Scenario& s) { return world()->size() / s.replica_size <= 2 && s.replica_size <= 2; }

void check_against_replay(const Scenario& s) {
  const std::vector<std::vector<float>> live = live_run(s);
  const auto expected = replay(s);
  const std::size_t k = static_cast<std::size_t>(world()->rank() / s.replica_size);
  const bool exact = pairwise_only(s);
  INFO("world " << world()->size() << ", replicas of " << s.replica_size << (exact ? ", bitwise" : ", to rounding"));
  for (std::size_t t = 0; t < live.size(); ++t) {
    INFO("step " << t);
    const std::vector<float>& want = expected[k][t];
    REQUIRE(live[t].size() == want.size());
    if (exact) {
      CHECK(shardopt_test::bitwise_equal(live[t], want));
    } else {
      float worst = 0.f;
      for (std::size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(live[t][i] - want[i]) / std::max(1.0f, std::fabs(want[i])));
      }
      CHECK(worst <= 1e-5f);
    }
  }
}

}  // namespace

TEST_CASE("periodic averaging of one-rank replicas matches the replay", "[averaging]") {
  for (int64_t warmup : {0, 2}) {
    Scenario s;
    s.averaging = periodic_averager(3, warmup);
    check_against_replay(s);
  }
}

TEST_CASE("replicas of two ranks (ZeRO inside, averaging across) match the replay", "[averaging]") {
  if (world()->size() % 2 != 0) return;
  for (int stage : {1, 2}) {
    Scenario s;
    s.replica_size = 2;
    s.stage = stage;
    s.algorithm = Algorithm::adamw;
    s.partition = stage == 2 ? PartitionStrategy::sorted_greedy : PartitionStrategy::flat;
    s.averaging = periodic_averager(2, 1);
    check_against_replay(s);
  }
}

TEST_CASE("hierarchical averaging matches the replay, the largest period winning", "[averaging]") {
  if (world()->size() != 4) return;
  Scenario s;
  s.algorithm = Algorithm::sgd;
  s.averaging = hierarchical_averager({{2, 2}, {4, 4}}, 1);
  check_against_replay(s);
}

TEST_CASE("the outer optimizer (Nesterov SGD on the pseudo-gradient) matches the replay", "[averaging]") {
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    Scenario s;
    s.replica_size = L;
    s.averaging = periodic_averager(2, 2);
    s.averaging.outer.enabled = true;
    check_against_replay(s);
  }
}

TEST_CASE("bf16 replicas average their fp32 masters: sharded equals replicated bitwise", "[averaging]") {
  if (world()->size() % 2 != 0) return;
  Scenario sharded;
  sharded.replica_size = 2;
  sharded.dtype = DType::bf16;
  sharded.stage = 2;
  sharded.averaging = periodic_averager(2, 1);
  sharded.averaging.outer.enabled = true;
  Scenario replicated = sharded;
  replicated.shard_state = false;
  replicated.stage = 1;
  const auto a = live_run(sharded);
  const auto b = live_run(replicated);
  for (std::size_t t = 0; t < a.size(); ++t) {
    INFO("step " << t);
    CHECK(shardopt_test::bitwise_equal(a[t], b[t]));
  }
  // Step 7 averaged (periodic 2 after warmup 1), step 8 did not: the replicas met, then drifted.
  if (world()->size() / 2 > 1) {
    for (std::size_t t : {std::size_t{7}, std::size_t{8}}) {
      std::vector<float> other = a[t];
      world()->broadcast(other.data(), static_cast<int64_t>(other.size()), DType::f32, world()->size() - 1);
      if (world()->rank() < 2) CHECK(shardopt_test::bitwise_equal(a[t], other) == (t == 7));  // another replica
    }
  }
}

TEST_CASE("a resume from a checkpoint taken mid-period continues bitwise", "[averaging][checkpoint]") {
  const int rank = world()->rank();
  std::string dir = "averaging_ckpt_np" + std::to_string(world()->size());
  for (int L : {1, 2}) {
    if (world()->size() % L != 0) continue;
    Scenario s;
    s.replica_size = L;
    s.averaging = periodic_averager(3, 1);
    s.averaging.outer.enabled = L == 2;
    if (rank == 0) std::filesystem::remove_all(dir);
    world()->barrier();
    const std::vector<std::vector<float>> straight = live_run(s);
    // Save after step 2 (one step into a period), train on, then resume from it.
    {
      Replica replica(world()->split(rank / L, rank), s);
      PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
      for (int t = 0; t < 3; ++t) {
        hand_gradients(plsgd, s, t);
        plsgd.step();
      }
      plsgd.save(dir);
      plsgd.save(dir);  // a second save replaces the first
    }
    Replica replica(world()->split(rank / L, rank), s);
    PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
    plsgd.load(dir);
    CHECK(plsgd.averager().step() == 3);
    CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), straight[2]));
    for (int t = 3; t < kSteps; ++t) {
      hand_gradients(plsgd, s, t);
      plsgd.step();
      INFO("replicas of " << L << ", step " << t);
      CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), straight[static_cast<std::size_t>(t)]));
    }
    if (rank == 0) {
      int saves = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir)) saves += e.is_directory() ? 1 : 0;
      CHECK(saves == 1);  // the older save was removed once the newer one committed
    }
    world()->barrier();
  }
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a damaged local-SGD record is refused on every rank and nothing changes", "[averaging][checkpoint]") {
  const int rank = world()->rank();
  const std::string dir = "averaging_damaged_np" + std::to_string(world()->size());
  Scenario s;
  s.averaging = periodic_averager(2, 0);
  Replica replica(world()->split(rank, 0), s);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
  hand_gradients(plsgd, s, 0);
  plsgd.step();
  plsgd.save(dir);
  world()->barrier();
  if (rank == 0) {
    std::string text;
    {
      std::ifstream in(dir + "/local_sgd.json");
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    text[text.find("\"averager_step\": 1") + 17] = '7';
    std::ofstream(dir + "/local_sgd.json") << text;
  }
  world()->barrier();
  const std::vector<float> before = params_of(*replica.opt);
  const auto [code, message] = error_of([&] { plsgd.load(dir); });
  CHECK(code == ErrorCode::corrupt);
  CHECK_THAT(message, Catch::Contains("checksum"));
  CHECK(shardopt_test::bitwise_equal(params_of(*replica.opt), before));
  CHECK(plsgd.averager().step() == 1);
  world()->barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("torch's validation errors, on every rank", "[averaging]") {
  const int rank = world()->rank();
  Scenario s;
  Replica replica(world()->split(rank, 0), s);
  auto expect = [&](AveragerConfig config, const char* words) {
    const auto [code, message] = error_of([&] { ModelAverager averager(world(), *replica.opt, config); });
    CHECK(code == ErrorCode::invalid_argument);
    CHECK_THAT(message, Catch::Contains(words));
  };
  expect(periodic_averager(0), "Arg ``period`` must be a positive value");
  expect(periodic_averager(2, -1), "Arg ``warmup_steps`` must be a non-negative number");
  expect(hierarchical_averager({}), "Arg ``period_group_size_dict`` must not be empty");
  expect(hierarchical_averager({{0, 0}}), "The minimum period in arg ``period_group_size_dict`` must be a positive");
  if (world()->size() > 1) {
    expect(hierarchical_averager({{2, 1}}), "must be equal to the size of arg ``process_group``");
  }
  if (world()->size() % 2 == 0) expect(hierarchical_averager({{4, 2}, {2, 0}}), "must increase");
  if (world()->size() == 4) expect(hierarchical_averager({{2, 3}, {4, 4}}), "must be divisible by 'group_size=3'");
  // One rank's bad config fails every rank, naming it.
  const auto [code, message] =
      error_of([&] { ModelAverager averager(world(), *replica.opt, periodic_averager(rank == world()->size() - 1 ? 0 : 2)); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("period"));
}

TEST_CASE("ranks that configure the averager differently get a named mismatch", "[averaging]") {
  if (world()->size() < 2) return;
  const int rank = world()->rank();
  Scenario s;
  Replica replica(world()->split(rank, 0), s);
  const auto [code, message] =
      error_of([&] { ModelAverager averager(world(), *replica.opt, periodic_averager(2, rank == 1 ? 3 : 1)); });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(message, Catch::Contains("warmup_steps"));
}

TEST_CASE("replicas that straddle an averaging group are refused on every rank", "[averaging]") {
  if (world()->size() != 4) return;
  const int rank = world()->rank();
  Scenario s;
  Replica replica(world()->split(rank % 2, rank), s);  // replicas {0, 2} and {1, 3}
  const auto [code, message] =
      error_of([&] { ModelAverager averager(world(), *replica.opt, hierarchical_averager({{2, 2}, {4, 4}})); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("different averaging groups"));
}

TEST_CASE("state_dict carries the averager's step; a dict without one restarts it with torch's warning", "[averaging]") {
  const int rank = world()->rank();
  Scenario s;
  s.averaging = periodic_averager(2, 1);
  Replica replica(world()->split(rank, 0), s);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
  for (int t = 0; t < 3; ++t) {
    hand_gradients(plsgd, s, t);
    plsgd.step();
  }
  plsgd.consolidate_state_dict(0);
  PostLocalSGDStateDict dict = plsgd.state_dict();
  CHECK(dict.has_step);
  CHECK(dict.step == 3);
  CHECK(dict.optimizer.state.size() == kSizes.size());
  dict.has_step = false;
  plsgd.load_state_dict(dict);
  CHECK(plsgd.averager().step() == 0);
  CHECK(plsgd.load_warning() ==
        "Loaded state dict does not contain a step counter for an averager. Setting step counter to 0.");
  dict.has_step = true;
  plsgd.load_state_dict(dict);
  CHECK(plsgd.averager().step() == 3);
  CHECK(plsgd.load_warning().empty());
}

TEST_CASE("communication counts: gradients cross replicas in warmup only, parameters every period", "[averaging]") {
  const int rank = world()->rank();
  Scenario s;
  s.averaging = periodic_averager(4, 2);
  Replica replica(world()->split(rank, 0), s);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, s.averaging);
  for (int t = 0; t < 10; ++t) {
    hand_gradients(plsgd, s, t);
    plsgd.step();
  }
  int64_t numel = 0;
  for (int64_t n : kSizes) numel += n;
  const CommunicationCounts& c = plsgd.communication();
  const int64_t crossing = world()->size() > 1 ? 1 : 0;
  CHECK(c.gradient_bytes == crossing * 2 * numel * 4);       // steps 0 and 1
  CHECK(c.averages == 2);                                     // steps 2 and 6
  CHECK(c.averaging_bytes == crossing * 2 * numel * 4);
}
