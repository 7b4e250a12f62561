// tests/checkpoint/test_checkpoint.cpp — save/load round trips, resharding, export identity, corruption, crash safety, state dicts.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt_models.hpp"
#include "ckpt_test_support.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;
using shardopt_test::file_bytes;
using shardopt_test::scratch;
using shardopt_test::shard_files;
using shardopt_test::world;
using shardopt_test::kSizes;
using shardopt_test::Model;
using shardopt_test::make_optimizer;
using shardopt_test::train;
using shardopt_test::all_steps;
namespace fs = std::filesystem;

namespace {

// The first `k` ranks of the world as a communicator (null on the others, after the split).
std::shared_ptr<Communicator> first_ranks(int k) {
  auto comm = world()->split(world()->rank() < k ? 0 : 1, world()->rank());
  return world()->rank() < k ? comm : nullptr;
}

std::vector<OptimizerConfig> all_configs() {
  std::vector<OptimizerConfig> configs;
  for (Algorithm a : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) {
    for (PartitionStrategy p : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage s : {Storage::bucket_view, Storage::external}) {
        OptimizerConfig c;
        c.algorithm = a;
        c.partition = p;
        c.storage = s;
        c.bucket_bytes = 64;
        configs.push_back(c);
      }
    }
  }
  OptimizerConfig replicated;
  replicated.shard_state = false;
  configs.push_back(replicated);
  return configs;
}

}  // namespace

TEST_CASE("save at N, load at N: training continues bitwise as if never stopped", "[checkpoint]") {
  const std::string dir = scratch("same_world");
  for (const OptimizerConfig& config : all_configs()) {
    for (bool freeze : {false, true}) {
      CAPTURE(algorithm_name(config.algorithm), partition_name(config.partition), static_cast<int>(config.storage),
              config.shard_state, freeze);
      Model reference_model(kSizes, 7);
      auto reference = make_optimizer(world(), config, reference_model, kSizes, freeze);
      train(*reference, 0, 6);

      Model first_model(kSizes, 7);
      auto first = make_optimizer(world(), config, first_model, kSizes, freeze);
      train(*first, 0, 3);
      first->save(dir);

      Model resumed_model(kSizes, 99);  // other initial values: the load must restore them
      auto resumed = make_optimizer(world(), config, resumed_model, kSizes, /*freeze=*/false);
      resumed->load(dir);
      REQUIRE(bitwise_equal(all_params(*resumed), all_params(*first)));
      REQUIRE(all_steps(*resumed) == all_steps(*first));
      REQUIRE(resumed->hyperparams(0).lr == first->hyperparams(0).lr);
      REQUIRE(resumed->trainable(static_cast<ParamId>(kSizes.size() - 2)) == !freeze);
      train(*resumed, 3, 6);
      REQUIRE(bitwise_equal(all_params(*resumed), all_params(*reference)));
      REQUIRE(all_steps(*resumed) == all_steps(*reference));
      // Repeated saves into one directory keep only the newest save's files.
      if (world()->rank() == 0) {
        REQUIRE(shard_files(dir).size() == static_cast<std::size_t>(read_checkpoint_info(dir).num_files));
      }
      world()->barrier();
    }
  }
}

TEST_CASE("a checkpoint of N ranks resumes at every smaller world size and other partition", "[checkpoint][reshard]") {
  const int n = world()->size();
  const std::string dir = scratch("reshard");
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adamw}) {
    OptimizerConfig config;
    config.algorithm = algorithm;
    Model reference_model(kSizes, 11);
    auto reference = make_optimizer(world(), config, reference_model);
    train(*reference, 0, 7);

    Model saved_model(kSizes, 11);
    auto saved = make_optimizer(world(), config, saved_model);
    train(*saved, 0, 4);
    saved->save(dir);

    for (int k = 1; k <= n; ++k) {
      for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
        CAPTURE(algorithm_name(algorithm), k, partition_name(partition));
        auto comm = first_ranks(k);
        if (comm) {
          OptimizerConfig other = config;
          other.partition = partition;
          Model model(kSizes, 5);
          auto resumed = make_optimizer(comm, other, model);
          resumed->load(dir);
          train(*resumed, 4, 7);
          REQUIRE(bitwise_equal(all_params(*resumed), all_params(*reference)));
          REQUIRE(all_steps(*resumed) == all_steps(*reference));
        }
        world()->barrier();
      }
    }
  }
}

TEST_CASE("export of the same training saved at 1..N ranks is byte-identical", "[checkpoint][export]") {
  const int n = world()->size();
  const std::string dir = scratch("export");
  for (int k = 1; k <= n; ++k) {
    auto comm = first_ranks(k);
    if (comm) {
      OptimizerConfig config;
      config.partition = k % 2 == 0 ? PartitionStrategy::sorted_greedy : PartitionStrategy::flat;
      Model model(kSizes, 3);
      auto opt = make_optimizer(comm, config, model, kSizes, /*freeze=*/true);
      train(*opt, 0, 4);
      const std::string saved = dir + "/saved" + std::to_string(k);
      opt->save(saved);
      if (comm->rank() == 0) export_checkpoint(saved, dir + "/export" + std::to_string(k) + ".safetensors");
    }
    world()->barrier();
  }
  if (world()->rank() == 0) {
    const std::string first = file_bytes(dir + "/export1.safetensors");
    REQUIRE(first.size() > 4 * 2 * 3 * 400);  // params and three state kinds of ~480 elements
    for (int k = 2; k <= n; ++k) {
      CAPTURE(k);
      REQUIRE(file_bytes(dir + "/export" + std::to_string(k) + ".safetensors") == first);
    }
    // Offline resharding gives the same export too.
    ReshardOptions options;
    options.world_size = 5;
    reshard_checkpoint(dir + "/saved1", dir + "/resharded5", options);
    REQUIRE(read_checkpoint_info(dir + "/resharded5").world_size == 5);
    export_checkpoint(dir + "/resharded5", dir + "/export_r5.safetensors");
    REQUIRE(file_bytes(dir + "/export_r5.safetensors") == first);
  }
  world()->barrier();
}

TEST_CASE("damaged or foreign checkpoints are refused on every rank, the optimizer untouched", "[checkpoint][errors]") {
  const int n = world()->size();
  const std::string good = scratch("good");
  OptimizerConfig config;
  Model model(kSizes, 21);
  auto opt = make_optimizer(world(), config, model);
  train(*opt, 0, 3);
  opt->save(good);
  const CheckpointInfo info = read_checkpoint_info(good);
  REQUIRE(info.world_size == n);
  REQUIRE(info.max_step == 3);
  train(*opt, 3, 4);  // the live optimizer moves on: a refused load must leave it here
  const std::vector<float> before = all_params(*opt);
  const std::vector<int64_t> steps_before = all_steps(*opt);

  // Each case damages a copy of the good checkpoint on rank 0, then every rank loads it.
  auto damaged = [&](const std::string& name, auto&& damage) {
    const std::string dir = scratch(name);
    if (world()->rank() == 0) {
      fs::copy(good, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      damage(dir);
    }
    world()->barrier();
    return dir;
  };
  auto last_shard = [](const std::string& dir) { return dir + "/" + shard_files(dir).back(); };
  auto expect_refused = [&](const std::string& dir, ErrorCode code, const std::string& needle) {
    auto [c, message] = shardopt_test::error_of([&] { opt->load(dir); });
    CAPTURE(message);
    REQUIRE(c == code);
    REQUIRE(message.find(needle) != std::string::npos);
    REQUIRE(bitwise_equal(all_params(*opt), before));
    REQUIRE(all_steps(*opt) == steps_before);
  };

  SECTION("truncated shard") {
    std::string file;
    const std::string dir = damaged("truncated", [&](const std::string& d) {
      file = last_shard(d);
      fs::resize_file(file, fs::file_size(file) - 100);
    });
    expect_refused(dir, ErrorCode::corrupt, "truncated");
    expect_refused(dir, ErrorCode::corrupt, shard_files(dir).back());
  }
  SECTION("one flipped byte") {
    const std::string dir = damaged("flipped", [&](const std::string& d) {
      const std::string file = last_shard(d);
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-5, std::ios::end);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x01);
      f.seekp(-5, std::ios::end);
      f.write(&c, 1);
    });
    expect_refused(dir, ErrorCode::corrupt, "CRC32C");
    expect_refused(dir, ErrorCode::corrupt, shard_files(dir).back());
    if (world()->rank() == 0) REQUIRE_THROWS_AS(verify_checkpoint(dir), Error);
  }
  SECTION("missing shard") {
    std::string missing;
    const std::string dir = damaged("missing", [&](const std::string& d) {
      missing = shard_files(d).front();
      fs::remove(d + "/" + missing);
    });
    expect_refused(dir, ErrorCode::io, "missing");
  }
  SECTION("newer format version") {
    // A newer shardopt's manifest, sealed with a valid checksum: refused as newer, not as corrupt.
    const std::string dir = damaged("newer", [&](const std::string& d) {
      auto j = shardopt_test::manifest_json(file_bytes(d + "/manifest.json"));
      REQUIRE(j["format_version"] == 2);
      j["format_version"] = 3;
      shardopt_test::write_bytes(d + "/manifest.json", shardopt_test::sealed_manifest_text(j));
    });
    expect_refused(dir, ErrorCode::unsupported, "format version 3");
    expect_refused(dir, ErrorCode::unsupported, "upgrade shardopt");
  }
  SECTION("the manifest edited by hand (its checksum not recomputed)") {
    const std::string dir = damaged("edited", [&](const std::string& d) {
      std::string text = file_bytes(d + "/manifest.json");
      const std::string from = "\"layer1.weight\"";
      REQUIRE(text.find(from) != std::string::npos);
      text.replace(text.find(from), from.size(), "\"layer1.weigh7\"");
      shardopt_test::write_bytes(d + "/manifest.json", text);
    });
    expect_refused(dir, ErrorCode::corrupt, "manifest.json' is corrupt: its manifest_crc32c says");
    if (world()->rank() == 0) REQUIRE_THROWS_AS(verify_checkpoint(dir), Error);
  }
  SECTION("no checkpoint at all") {
    const std::string dir = scratch("empty");
    expect_refused(dir, ErrorCode::io, "manifest.json");
  }
  SECTION("a checkpoint of another model") {
    std::vector<int64_t> other_sizes = kSizes;
    other_sizes[4] += 1;
    Model other_model(other_sizes, 1);
    auto other = make_optimizer(world(), config, other_model, other_sizes);
    const std::vector<float> other_before = all_params(*other);
    auto [c, message] = shardopt_test::error_of([&] { other->load(good); });
    CAPTURE(message);
    REQUIRE(c == ErrorCode::mismatch);
    REQUIRE(message.find("parameter #4") != std::string::npos);
    REQUIRE(message.find("layer4.weight") != std::string::npos);
    REQUIRE(bitwise_equal(all_params(*other), other_before));
    // Another algorithm is another optimizer.
    OptimizerConfig sgd;
    sgd.algorithm = Algorithm::sgd;
    Model sgd_model(kSizes, 1);
    auto sgd_opt = make_optimizer(world(), sgd, sgd_model);
    auto [c2, message2] = shardopt_test::error_of([&] { sgd_opt->load(good); });
    REQUIRE(c2 == ErrorCode::mismatch);
    REQUIRE(message2.find("adam") != std::string::npos);
  }
}

TEST_CASE("state kept after its hyperparameter is switched off survives save and load, as torch keeps it",
          "[checkpoint][state_kinds]") {
  // SGD momentum buffers exist; momentum goes to 0 (the buffers stay, unused); the checkpoint
  // is saved then; momentum comes back and uses the buffers again. Loading must not drop them.
  const std::string dir = scratch("kept_state");
  OptimizerConfig config;
  config.algorithm = Algorithm::sgd;
  auto set_momentum = [](ZeroOptimizer& opt, double m) {
    for (int g = 0; g < 2; ++g) opt.hyperparams(g).momentum = m;
  };
  Model reference_model(kSizes, 17);
  auto reference = make_optimizer(world(), config, reference_model);
  train(*reference, 0, 3);
  set_momentum(*reference, 0.0);
  train(*reference, 3, 4);
  set_momentum(*reference, 0.9);
  train(*reference, 4, 6);

  Model saved_model(kSizes, 17);
  auto saved = make_optimizer(world(), config, saved_model);
  train(*saved, 0, 3);
  set_momentum(*saved, 0.0);
  train(*saved, 3, 4);
  saved->save(dir);
  if (world()->rank() == 0) REQUIRE(read_checkpoint_info(dir).state_kinds == std::vector<std::string>{"momentum_buffer"});

  Model resumed_model(kSizes, 3);
  auto resumed = make_optimizer(world(), config, resumed_model);
  resumed->load(dir);
  REQUIRE(resumed->hyperparams(0).momentum == 0.0);
  set_momentum(*resumed, 0.9);
  train(*resumed, 4, 6);
  REQUIRE(bitwise_equal(all_params(*resumed), all_params(*reference)));
}

TEST_CASE("a save killed before its manifest leaves the previous checkpoint intact", "[checkpoint][crash]") {
  const std::string dir = scratch("crash");
  OptimizerConfig config;
  Model model(kSizes, 31);
  auto opt = make_optimizer(world(), config, model);
  train(*opt, 0, 2);
  opt->save(dir);
  const std::vector<float> at_save = all_params(*opt);
  const std::string manifest_before = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
  train(*opt, 2, 4);

  ::setenv("SHARDOPT_TEST_ABORT_SAVE_AFTER", "shards", 1);
  auto [code, message] = shardopt_test::error_of([&] { opt->save(dir); });
  ::unsetenv("SHARDOPT_TEST_ABORT_SAVE_AFTER");
  REQUIRE(code == ErrorCode::internal);
  REQUIRE(message.find("SHARDOPT_TEST_ABORT_SAVE_AFTER") != std::string::npos);

  if (world()->rank() == 0) {
    REQUIRE(file_bytes(dir + "/manifest.json") == manifest_before);
    const int files = read_checkpoint_info(dir).num_files;
    REQUIRE(shard_files(dir).size() == static_cast<std::size_t>(2 * files));  // the aborted save's are orphans
    verify_checkpoint(dir);
  }
  Model fresh_model(kSizes, 77);
  auto fresh = make_optimizer(world(), config, fresh_model);
  fresh->load(dir);
  REQUIRE(bitwise_equal(all_params(*fresh), at_save));

  // The next complete save replaces the old checkpoint and sweeps the orphans away.
  opt->save(dir);
  if (world()->rank() == 0) {
    REQUIRE(shard_files(dir).size() == static_cast<std::size_t>(read_checkpoint_info(dir).num_files));
    REQUIRE(read_checkpoint_info(dir).max_step == 4);
  }
  world()->barrier();
}

TEST_CASE("consolidate_state_dict / state_dict / load_state_dict follow torch's semantics", "[checkpoint][state_dict]") {
  const int n = world()->size(), me = world()->rank();
  for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adam}) {
    CAPTURE(algorithm_name(algorithm));
    OptimizerConfig config;
    config.algorithm = algorithm;
    config.partition = PartitionStrategy::sorted_greedy;
    Model model(kSizes, 41);
    auto opt = make_optimizer(world(), config, model, kSizes, /*freeze=*/true);
    train(*opt, 0, 3);
    REQUIRE_THROWS_AS(opt->state_dict(), Error);  // not consolidated yet

    // The same training on one rank gives the reference dict.
    auto solo = world()->split(me, 0);
    Model solo_model(kSizes, 41);
    auto single = make_optimizer(solo, config, solo_model, kSizes, true);
    train(*single, 0, 3);
    single->consolidate_state_dict(0);
    const StateDict expected = single->state_dict();
    REQUIRE(expected.state.size() == kSizes.size() - 1);  // all but the frozen one
    for (const auto& [id, s] : expected.state) {
      REQUIRE(s.step == 3);
      REQUIRE(s.tensors.size() == (algorithm == Algorithm::sgd ? 1u : 3u));
    }

    const int to = n - 1;
    opt->consolidate_state_dict(to);
    if (me == to) {
      const StateDict got = opt->state_dict();
      REQUIRE(got.param_names == expected.param_names);
      REQUIRE(got.state.size() == expected.state.size());
      for (const auto& [id, s] : expected.state) {
        CAPTURE(id);
        REQUIRE(got.state.at(id).step == s.step);
        for (const auto& [kind, values] : s.tensors) REQUIRE(bitwise_equal(got.state.at(id).tensors.at(kind), values));
      }
      REQUIRE(got.param_groups.size() == 2);
      REQUIRE(got.param_groups[0].hyper.lr == opt->hyperparams(0).lr);
    } else {
      REQUIRE_THROWS_AS(opt->state_dict(), Error);
    }

    // Loading the full dict on every rank (each keeps its share) continues like the original.
    Model reference_model(kSizes, 41);
    auto reference = make_optimizer(world(), config, reference_model, kSizes, true);
    train(*reference, 0, 6);
    Model resumed_model(kSizes, 41);
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      TensorRef v = opt->param_view(id);
      resumed_model.values[static_cast<std::size_t>(id)].assign(v.as<float>(), v.as<float>() + v.numel);
    }
    auto resumed = make_optimizer(world(), config, resumed_model, kSizes, true);
    resumed->load_state_dict(expected);
    REQUIRE(resumed->hyperparams(0).lr == opt->hyperparams(0).lr);
    train(*resumed, 3, 6);
    REQUIRE(bitwise_equal(all_params(*resumed), all_params(*reference)));

    StateDict wrong = expected;
    wrong.param_names[1] = "something.else";
    auto [code, message] = shardopt_test::error_of([&] { resumed->load_state_dict(wrong); });
    REQUIRE(code == ErrorCode::mismatch);
    REQUIRE(message.find("something.else") != std::string::npos);
  }
}

TEST_CASE("shardopt-ckpt: info, verify, export, reshard", "[checkpoint][cli]") {
  const std::string dir = scratch("cli");
  OptimizerConfig config;
  Model model(kSizes, 51);
  auto opt = make_optimizer(world(), config, model);
  train(*opt, 0, 2);
  opt->save(dir + "/ckpt");
  if (world()->rank() == 0) {
    const std::string tool = SHARDOPT_CKPT_TOOL;
    auto run = [&](const std::string& args) { return std::system((tool + " " + args + " > " + dir + "/out.txt 2>&1").c_str()); };
    REQUIRE(run("info " + dir + "/ckpt") == 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("world size      " + std::to_string(world()->size())) != std::string::npos);
    REQUIRE(run("verify " + dir + "/ckpt") == 0);
    REQUIRE(run("export " + dir + "/ckpt " + dir + "/a.safetensors") == 0);
    REQUIRE(run("reshard " + dir + "/ckpt " + dir + "/r3 --world 3 --partition sorted_greedy") == 0);
    REQUIRE(run("export " + dir + "/r3 " + dir + "/b.safetensors") == 0);
    REQUIRE(file_bytes(dir + "/a.safetensors") == file_bytes(dir + "/b.safetensors"));
    REQUIRE(run("info " + dir + "/r3") == 0);
    REQUIRE(file_bytes(dir + "/out.txt").find("world size      3 (3 shard files, partition sorted_greedy)") != std::string::npos);
    // A flipped byte: verify fails and says where.
    const std::string victim = dir + "/r3/" + shard_files(dir + "/r3")[1];
    {
      std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-1, std::ios::end);
      const char c = static_cast<char>(f.get() ^ 0x40);
      f.seekp(-1, std::ios::end);
      f.put(c);
    }
    REQUIRE(run("verify " + dir + "/r3") != 0);
    REQUIRE(file_bytes(dir + "/out.txt").find(shard_files(dir + "/r3")[1]) != std::string::npos);
    REQUIRE(run("bogus") != 0);
  }
  world()->barrier();
}
