// tests/precision/test_mixed_precision.cpp — bf16/f16 params with fp32 masters, stochastic rounding, ZeRO-2, loss scaling and memory accounting, at every world size.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "shardopt/checkpoint.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::busy_hyperparams;
using shardopt_test::error_of;
using shardopt_test::world;

std::shared_ptr<Communicator> solo() { return world()->split(world()->rank(), 0); }

// Sizes with odd lengths, one larger than a bucket, and one tiny param: spread over ranks, they
// straddle shard and bucket boundaries.
const std::vector<int64_t> kSizes = {1, 37, 1000, 4099, 16, 3};

uint16_t narrow(float x, DType dtype) {
  return dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x);
}
float widen(uint16_t h, DType dtype) {
  return dtype == DType::bf16 ? kernels::bf16_to_float(h) : kernels::f16_to_float(h);
}

// A parameter's values as raw 16- or 32-bit words, so one container serves every dtype.
using Words = std::vector<uint32_t>;

Words encode(const std::vector<float>& values, DType dtype) {
  Words out;
  out.reserve(values.size());
  for (float v : values) {
    uint32_t word = 0;
    if (dtype == DType::f32) std::memcpy(&word, &v, 4);
    else word = narrow(v, dtype);
    out.push_back(word);
  }
  return out;
}

// Copies words into a buffer of `dtype` elements and back.
void store(const Words& words, void* data, DType dtype) {
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (dtype == DType::f32) {
      std::memcpy(static_cast<char*>(data) + 4 * i, &words[i], 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(words[i]);
      std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2);
    }
  }
}
Words load(const TensorRef& view) {
  Words out(static_cast<std::size_t>(view.numel));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (view.dtype == DType::f32) {
      std::memcpy(&out[i], static_cast<char*>(view.data) + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, static_cast<char*>(view.data) + 2 * i, 2);
      out[i] = h;
    }
  }
  return out;
}

// Gradients on a coarse grid (k / 128, |k| <= 16): sums over up to 4 ranks and squares are
// exact in bf16/f16/f32 and double, so averaging and norms are exact whatever the order — and
// N ranks can be compared with one rank bitwise even through reduce_gradients and clipping.
std::vector<float> grid_grads(uint32_t seed, int64_t n) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> k(-16, 16);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (float& v : g) v = static_cast<float>(k(gen)) / 128.f;
  return g;
}

struct Trial {
  DType dtype = DType::bf16;
  Algorithm algorithm = Algorithm::adamw;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  int stage = 1;
  bool stochastic = false;
  bool reduce = true;      // go through reduce_gradients (identical grads on every rank)
  double clip = 0.0;       // > 0: clip_grad_norm(clip) before each step
  int64_t pipeline = 0;    // OptimizerConfig::pipeline_chunk_bytes
  int steps = 4;
};

// Trains the kSizes model for trial.steps steps over `comm`; returns every param's words.
std::vector<Words> train(const std::shared_ptr<Communicator>& comm, const Trial& t) {
  OptimizerConfig config;
  config.algorithm = t.algorithm;
  config.partition = t.partition;
  config.storage = t.storage;
  config.stage = t.stage;
  config.stochastic_rounding = t.stochastic;
  config.rounding_seed = 7;
  config.bucket_bytes = 512;  // several buckets, and params cut across them
  config.pipeline_chunk_bytes = t.pipeline;
  const std::size_t width = dtype_size(t.dtype);
  std::vector<std::vector<char>> params(kSizes.size()), grads(kSizes.size());
  std::vector<ParamGroupSpec> groups(2);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    params[i].resize(static_cast<std::size_t>(kSizes[i]) * width);
    grads[i].resize(static_cast<std::size_t>(kSizes[i]) * width);
    store(encode(shardopt_test::seeded_values(static_cast<uint32_t>(100 + i), kSizes[i]), t.dtype), params[i].data(), t.dtype);
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{params[i].data(), kSizes[i], t.dtype, Device::cpu()};
    if (t.storage == Storage::external) p.grad = TensorRef{grads[i].data(), kSizes[i], t.dtype, Device::cpu()};
    groups[i % 2].params.push_back(p);
  }
  groups[0].hyper = busy_hyperparams(t.algorithm);
  groups[1].hyper = busy_hyperparams(t.algorithm);
  groups[1].hyper.lr = *groups[1].hyper.lr * 0.5;
  ZeroOptimizer opt(comm, config, groups);

  for (int step = 0; step < t.steps; ++step) {
    opt.zero_grad();
    // Backward order: last registered first, as a trainer's hooks would hand them.
    for (std::size_t j = kSizes.size(); j-- > 0;) {
      const ParamId id = opt.find_param("p" + std::to_string(j));
      const Words g = encode(grid_grads(static_cast<uint32_t>(1000 * step + j), kSizes[j]), t.dtype);
      if (t.stage == 2 && t.storage == Storage::bucket_view) {
        std::vector<char> local(static_cast<std::size_t>(kSizes[j]) * width);
        store(g, local.data(), t.dtype);
        opt.reduce_gradient(id, TensorRef{local.data(), kSizes[j], t.dtype, Device::cpu()});
      } else {
        store(g, opt.grad_view(id).data, t.dtype);
      }
    }
    if (t.reduce || t.stage == 2) opt.reduce_gradients();
    if (t.clip > 0) opt.clip_grad_norm(t.clip);
    opt.step();
  }
  std::vector<Words> out;
  for (std::size_t i = 0; i < kSizes.size(); ++i) out.push_back(load(opt.param_view(opt.find_param("p" + std::to_string(i)))));
  return out;
}

std::string trial_name(const Trial& t) {
  return fmt::format("{} {} {} {} stage {}{}{}", dtype_name(t.dtype), algorithm_name(t.algorithm),
                     partition_name(t.partition), t.storage == Storage::external ? "external" : "bucket_view",
                     t.stage, t.stochastic ? " stochastic" : "", t.clip > 0 ? " clipped" : "");
}

}  // namespace

TEST_CASE("bf16/f16 N-rank runs equal 1-rank runs bitwise, stage 1 and 2", "[precision]") {
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (int stage : {1, 2}) {
      for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
        for (Storage storage : {Storage::bucket_view, Storage::external}) {
          Trial t;
          t.dtype = dtype;
          t.stage = stage;
          t.partition = partition;
          t.storage = storage;
          t.algorithm = stage == 1 ? Algorithm::adamw : Algorithm::sgd;
          t.stochastic = dtype != DType::f32 && storage == Storage::external;
          t.clip = partition == PartitionStrategy::flat ? 0.5 : 0.0;
          t.pipeline = stage == 2 ? 200 : 0;  // 200 bytes: chunks of 96 (16-bit) or 48 (f32) elements
          CAPTURE(trial_name(t));
          const auto sharded = train(world(), t);
          const auto single = train(solo(), t);
          REQUIRE(sharded == single);
          // ...and training moved the params at all.
          Trial still = t;
          still.steps = 0;
          REQUIRE(train(solo(), still) != single);
        }
      }
    }
  }
}

TEST_CASE("stage 2 and the pipelined sync produce the bytes stage 1 produces", "[precision][stage2]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam}) {
      Trial t;
      t.dtype = dtype;
      t.algorithm = algorithm;
      t.clip = 1.0;
      CAPTURE(trial_name(t));
      const auto stage1 = train(world(), t);
      Trial pipelined = t;
      pipelined.pipeline = 64;
      REQUIRE(train(world(), pipelined) == stage1);
      t.stage = 2;
      REQUIRE(train(world(), t) == stage1);
      t.storage = Storage::external;
      REQUIRE(train(world(), t) == stage1);
    }
  }
}

TEST_CASE("the fp32 master follows an fp32 run fed the same rounded gradients", "[precision]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
      CAPTURE(dtype_name(dtype), algorithm_name(algorithm));
      const std::vector<int64_t> sizes = {5, 300, 77};
      // Low-precision values and their exact f32 widening, as the two runs' initial params.
      std::vector<Words> init(sizes.size());
      for (std::size_t i = 0; i < sizes.size(); ++i) init[i] = encode(shardopt_test::seeded_values(static_cast<uint32_t>(7 + i), sizes[i]), dtype);
      auto run = [&](DType run_dtype) {
        OptimizerConfig config;
        config.algorithm = algorithm;
        std::vector<std::vector<float>> f32_init(sizes.size());
        std::vector<std::vector<uint16_t>> low_init(sizes.size());
        ParamGroupSpec group;
        group.hyper = busy_hyperparams(algorithm);
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          ParamSpec p;
          p.name = "w" + std::to_string(i);
          if (run_dtype == DType::f32) {
            for (uint32_t w : init[i]) f32_init[i].push_back(widen(static_cast<uint16_t>(w), dtype));
            p.param = TensorRef{f32_init[i].data(), sizes[i], DType::f32, Device::cpu()};
          } else {
            for (uint32_t w : init[i]) low_init[i].push_back(static_cast<uint16_t>(w));
            p.param = TensorRef{low_init[i].data(), sizes[i], dtype, Device::cpu()};
          }
          group.params.push_back(p);
        }
        auto opt = std::make_unique<ZeroOptimizer>(world(), config, std::vector<ParamGroupSpec>{group});
        for (int step = 0; step < 5; ++step) {
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            // Arbitrary (not grid) gradients, rounded to the low precision for both runs.
            const Words g = encode(shardopt_test::seeded_values(static_cast<uint32_t>(50 * step + i), sizes[i], 2.f), dtype);
            const TensorRef view = opt->grad_view(static_cast<ParamId>(i));
            std::vector<float> wide;
            for (uint32_t w : g) wide.push_back(widen(static_cast<uint16_t>(w), dtype));
            if (run_dtype == DType::f32) std::memcpy(view.data, wide.data(), wide.size() * 4);
            else store(g, view.data, dtype);
          }
          opt->step();
        }
        return opt;
      };
      auto reference = run(DType::f32);
      auto mixed = run(dtype);
      mixed->consolidate_state_dict(0);
      if (world()->rank() == 0) {
        const StateDict sd = mixed->state_dict();
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const TensorRef expected = reference->param_view(static_cast<ParamId>(i));
          const std::vector<float>& master = sd.state.at(static_cast<ParamId>(i)).tensors.at("master");
          REQUIRE(std::memcmp(master.data(), expected.data, master.size() * 4) == 0);
          // ...and the param is the master rounded to nearest even.
          const Words param = load(mixed->param_view(static_cast<ParamId>(i)));
          REQUIRE(param == encode(master, dtype));
        }
      }
    }
  }
}

TEST_CASE("stochastic rounding is unbiased and reproducible with a seed", "[precision][rounding]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    const int64_t n = 20000;
    // One SGD step moves every master from 1 by 0.3 of the low precision's spacing at 1.
    const float spacing = dtype == DType::bf16 ? 1.f / 128 : 1.f / 1024;
    const float grad = widen(narrow(0.3f, dtype), dtype) * spacing;  // exactly representable
    auto step_once = [&](uint64_t seed, const std::shared_ptr<Communicator>& comm) {
      OptimizerConfig config;
      config.algorithm = Algorithm::sgd;
      config.stochastic_rounding = true;
      config.rounding_seed = seed;
      ParamGroupSpec group;
      group.hyper.lr = 1.0;
      std::vector<uint16_t> ones(static_cast<std::size_t>(n), narrow(1.f, dtype));
      group.params.push_back(ParamSpec{"p", TensorRef{ones.data(), n, dtype, Device::cpu()}, TensorRef{}});
      ZeroOptimizer opt(comm, config, {group});
      store(Words(static_cast<std::size_t>(n), narrow(-grad, dtype)), opt.grad_view(0).data, dtype);
      opt.step();
      return load(opt.param_view(0));
    };
    const Words a = step_once(11, world());
    REQUIRE(a == step_once(11, world()));
    REQUIRE(a == step_once(11, solo()));
    REQUIRE(a != step_once(12, world()));
    int64_t up = 0;
    double sum = 0;
    for (uint32_t w : a) {
      const float v = widen(static_cast<uint16_t>(w), dtype);
      REQUIRE((v == 1.f || v == 1.f + spacing));
      up += v != 1.f;
      sum += v;
    }
    const double p = static_cast<double>(grad / spacing);
    const double fraction = static_cast<double>(up) / static_cast<double>(n);
    const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    CHECK(std::abs(fraction - p) < 4 * sigma);
    CHECK(std::abs(sum / static_cast<double>(n) - (1.0 + static_cast<double>(grad))) < 4 * sigma * spacing);
  }
}

TEST_CASE("an inf on one rank skips the step on every rank and halves the scale", "[precision][scaling]") {
  const std::vector<int64_t> sizes = {64, 9};
  OptimizerConfig config;
  config.algorithm = Algorithm::adam;
  config.loss_scaling.enabled = true;
  config.loss_scaling.init_scale = 1024;
  config.loss_scaling.growth_interval = 3;
  ParamGroupSpec group;
  std::vector<std::vector<uint16_t>> init(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (uint32_t w : encode(shardopt_test::seeded_values(static_cast<uint32_t>(i), sizes[i]), DType::f16)) init[i].push_back(static_cast<uint16_t>(w));
    group.params.push_back(ParamSpec{"q" + std::to_string(i), TensorRef{init[i].data(), sizes[i], DType::f16, Device::cpu()}, TensorRef{}});
  }
  ZeroOptimizer opt(world(), config, {group});
  // Unscaled reference: the same model without loss scaling, fed unscaled gradients.
  OptimizerConfig plain = config;
  plain.loss_scaling.enabled = false;
  ZeroOptimizer reference(world(), plain, {group});
  REQUIRE(opt.loss_scale() == 1024.0);
  REQUIRE(reference.loss_scale() == 1.0);

  // Averaged over the ranks, as a trainer would: an inf in one rank's local gradients reaches
  // every rank's copy, whichever rank owns that element.
  auto feed = [&](ZeroOptimizer& o, int step, double scale, bool poison) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> g = grid_grads(static_cast<uint32_t>(10 * step + i), sizes[i]);
      for (float& v : g) v *= static_cast<float>(scale);  // a power of two: exact
      if (poison && i == 1) g[4] = INFINITY;
      store(encode(g, DType::f16), o.grad_view(static_cast<ParamId>(i)).data, DType::f16);
    }
    o.reduce_gradients();
  };
  const Words before = load(opt.param_view(0));
  // Only the last rank sees the overflow.
  feed(opt, 0, opt.loss_scale(), world()->rank() == world()->size() - 1);
  opt.step();
  REQUIRE(opt.last_step().skipped);
  REQUIRE(opt.last_step().loss_scale == 1024.0);
  REQUIRE(opt.last_step().skipped_steps == 1);
  REQUIRE(opt.loss_scale() == 512.0);
  REQUIRE(opt.param_step(0) == 0);
  REQUIRE(load(opt.param_view(0)) == before);

  for (int step = 1; step <= 3; ++step) {
    feed(opt, step, opt.loss_scale(), false);
    feed(reference, step, 1.0, false);
    opt.step();
    reference.step();
    REQUIRE_FALSE(opt.last_step().skipped);
    REQUIRE(opt.last_step().loss_scale == 512.0);
  }
  // Three clean steps in a row: the scale grows back.
  REQUIRE(opt.loss_scale() == 1024.0);
  REQUIRE(opt.param_step(0) == 3);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    REQUIRE(load(opt.param_view(static_cast<ParamId>(i))) == load(reference.param_view(static_cast<ParamId>(i))));
  }
  // Backoff never goes below min_scale.
  opt.set_loss_scale(1.5);
  feed(opt, 9, 1.0, true);
  opt.step();
  REQUIRE(opt.loss_scale() == 1.0);
}

TEST_CASE("the memory report matches the ZeRO formulas within the padding", "[precision][memory]") {
  const int n = world()->size();
  const std::vector<int64_t> sizes = {4096, 1000, 24, 7};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  // The flat partition pads the whole to a multiple of N x 16 elements.
  const int64_t padded = (total + 16 * n - 1) / (16 * n) * (16 * n);
  const int64_t shard = padded / n;
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    OptimizerConfig config;
    config.algorithm = Algorithm::adam;
    config.stage = stage;
    config.node_shared_params = false;  // the formulas count a copy of the parameters per rank
    ParamGroupSpec group;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      group.params.push_back(ParamSpec{"m" + std::to_string(i), TensorRef{nullptr, sizes[i], DType::bf16, Device::cpu()}, TensorRef{}});
    }
    ZeroOptimizer opt(world(), config, {group});
    const MemoryReport r = opt.memory_report();
    CHECK(r.param_bytes == 2 * padded);
    CHECK(r.grad_bytes == (stage == 1 ? 2 * padded : 2 * shard));
    CHECK(r.master_bytes == 4 * shard);
    CHECK(r.state_bytes == 8 * shard);
    CHECK(r.shard_numel == shard);
    // Bytes per parameter against 4 + 12/N (stage 1) and 2 + 14/N (stage 2).
    const double per_param = static_cast<double>(r.param_bytes + r.grad_bytes + r.master_bytes + r.state_bytes) / static_cast<double>(total);
    const double formula = stage == 1 ? 4.0 + 12.0 / n : 2.0 + 14.0 / n;
    const double padding = static_cast<double>(padded - total) / static_cast<double>(total);
    CHECK(per_param >= formula);
    CHECK(per_param <= formula * (1 + padding) + 1e-12);
  }
}

TEST_CASE("stage 2 and mixed-precision misuse is refused with errors that name it", "[precision][errors]") {
  std::vector<uint16_t> a(8), b(8);
  std::vector<float> c(8);
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"a", TensorRef{a.data(), 8, DType::bf16, Device::cpu()}, TensorRef{}});
  group.params.push_back(ParamSpec{"b", TensorRef{b.data(), 8, DType::bf16, Device::cpu()}, TensorRef{}});

  SECTION("one dtype per optimizer") {
    ParamGroupSpec mixed = group;
    mixed.params.push_back(ParamSpec{"c", TensorRef{c.data(), 8, DType::f32, Device::cpu()}, TensorRef{}});
    const auto [code, message] = error_of([&] { ZeroOptimizer(world(), OptimizerConfig{}, {mixed}); });
    CHECK(code == ErrorCode::unsupported);
    CHECK_THAT(message, Catch::Contains("'c' is f32") && Catch::Contains("parameter 'a' is bf16"));
  }
  SECTION("bad stage and loss-scaling settings") {
    OptimizerConfig config;
    config.stage = 3;
    CHECK_THAT(error_of([&] { ZeroOptimizer(world(), config, {group}); }).second, Catch::Contains("stage must be 1 or 2, got 3"));
    config.stage = 1;
    config.loss_scaling.enabled = true;
    config.loss_scaling.backoff_factor = NAN;
    CHECK_THAT(error_of([&] { ZeroOptimizer(world(), config, {group}); }).second, Catch::Contains("backoff_factor"));
  }
  SECTION("stage 2 hand-over rules") {
    OptimizerConfig config;
    config.stage = 2;
    ZeroOptimizer opt(world(), config, {group});
    CHECK_THAT(error_of([&] { opt.grad_view(0); }).second, Catch::Contains("reduce_gradient()"));
    std::vector<uint16_t> g(8, narrow(0.5f, DType::bf16));
    const TensorRef grad{g.data(), 8, DType::bf16, Device::cpu()};
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, TensorRef{g.data(), 7, DType::bf16, Device::cpu()}); }).second,
               Catch::Contains("'a' has 7 elements"));
    opt.reduce_gradient(0, grad);
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, grad); }).second, Catch::Contains("'a' was already handed"));
    CHECK_THAT(error_of([&] { opt.step(); }).second, Catch::Contains("not finished with reduce_gradients()"));
    // Every rank forgot 'b' alike: an error naming it, never a hang.
    CHECK_THAT(error_of([&] { opt.reduce_gradients(); }).second, Catch::Contains("never handed the gradient of 'b'"));
  }
  SECTION("stage 2 hand-over in another order on one rank") {
    if (world()->size() > 1) {
      OptimizerConfig config;
      config.stage = 2;
      ZeroOptimizer opt(world(), config, {group});
      std::vector<uint16_t> g(8, narrow(0.5f, DType::bf16));
      const TensorRef grad{g.data(), 8, DType::bf16, Device::cpu()};
      const bool reversed = world()->rank() == 1;
      opt.reduce_gradient(reversed ? 1 : 0, grad);
      opt.reduce_gradient(reversed ? 0 : 1, grad);
      const auto [code, message] = error_of([&] { opt.reduce_gradients(); });
      CHECK(code == ErrorCode::mismatch);
      CHECK_THAT(message, Catch::Contains("reduce_gradients: ranks disagree on gradient hand-over order"));
    }
  }
  SECTION("reduce_gradient is for stage 2, clip_grad_norm takes 2 or inf") {
    ZeroOptimizer opt(world(), OptimizerConfig{}, {group});
    std::vector<uint16_t> g(8);
    CHECK_THAT(error_of([&] { opt.reduce_gradient(0, TensorRef{g.data(), 8, DType::bf16, Device::cpu()}); }).second,
               Catch::Contains("is for stage 2"));
    CHECK_THAT(error_of([&] { opt.clip_grad_norm(1.0, 1.5); }).second, Catch::Contains("norm_type 1.5"));
    CHECK_THAT(error_of([&] { opt.clip_grad_norm(NAN); }).second, Catch::Contains("max_norm"));
  }
}

TEST_CASE("a bf16 checkpoint keeps the fp32 masters: resuming equals not stopping", "[precision][checkpoint]") {
  const std::vector<int64_t> sizes = {300, 41, 5};
  auto make = [&](const std::shared_ptr<Communicator>& comm, PartitionStrategy partition) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.partition = partition;
    ParamGroupSpec group;
    group.hyper = busy_hyperparams(config.algorithm);
    std::vector<std::vector<uint16_t>> init(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (uint32_t w : encode(shardopt_test::seeded_values(static_cast<uint32_t>(3 + i), sizes[i]), DType::bf16)) init[i].push_back(static_cast<uint16_t>(w));
      group.params.push_back(ParamSpec{"c" + std::to_string(i), TensorRef{init[i].data(), sizes[i], DType::bf16, Device::cpu()}, TensorRef{}});
    }
    return std::make_unique<ZeroOptimizer>(comm, config, std::vector<ParamGroupSpec>{group});
  };
  auto train_steps = [&](ZeroOptimizer& opt, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        // Gradients that move params by less than a bf16 step: only the masters remember them.
        std::vector<float> g = shardopt_test::seeded_values(static_cast<uint32_t>(70 * step + i), sizes[i], 1e-3f);
        store(encode(g, DType::bf16), opt.grad_view(static_cast<ParamId>(i)).data, DType::bf16);
      }
      opt.step();
    }
  };
  auto snapshot = [&](const ZeroOptimizer& opt) {
    std::vector<Words> out;
    for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(load(opt.param_view(static_cast<ParamId>(i))));
    return out;
  };
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/bf16";
  auto straight = make(solo(), PartitionStrategy::flat);
  train_steps(*straight, 0, 6);

  auto first = make(world(), PartitionStrategy::flat);
  train_steps(*first, 0, 3);
  first->save(dir);
  // Resumed at another partition (and, against the solo run, another world size).
  auto resumed = make(world(), PartitionStrategy::sorted_greedy);
  resumed->load(dir);
  REQUIRE(snapshot(*resumed) == snapshot(*first));
  train_steps(*resumed, 3, 6);
  REQUIRE(snapshot(*resumed) == snapshot(*straight));
  REQUIRE(resumed->param_step(0) == 6);
}

TEST_CASE("the loss scale and its growth count survive a checkpoint", "[precision][checkpoint][scaling]") {
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  config.loss_scaling.enabled = true;
  config.loss_scaling.init_scale = 256;
  config.loss_scaling.growth_interval = 2;
  std::vector<uint16_t> init(16, narrow(0.5f, DType::f16));
  ParamGroupSpec group;
  group.params.push_back(ParamSpec{"s", TensorRef{init.data(), 16, DType::f16, Device::cpu()}, TensorRef{}});
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/scale";
  ZeroOptimizer opt(world(), config, {group});
  auto step_with = [](ZeroOptimizer& o, float g) {
    store(Words(16, narrow(g, DType::f16)), o.grad_view(0).data, DType::f16);
    o.step();
  };
  step_with(opt, INFINITY);  // 256 -> 128
  step_with(opt, 1.f);       // one clean step counted towards growth
  REQUIRE(opt.loss_scale() == 128.0);
  opt.save(dir);
  ZeroOptimizer resumed(world(), config, {group});
  REQUIRE(resumed.loss_scale() == 256.0);
  resumed.load(dir);
  REQUIRE(resumed.loss_scale() == 128.0);
  step_with(resumed, 1.f);  // the second clean step in a row: the scale grows
  REQUIRE(resumed.loss_scale() == 256.0);
}
