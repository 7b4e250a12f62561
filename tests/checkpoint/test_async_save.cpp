// tests/checkpoint/test_async_save.cpp — save_async/wait_save: the bytes save() writes while steps go on, resumed bitwise, one rank's failure on every rank, the calls that complete or abandon a pending save.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "ckpt_models.hpp"
#include "ckpt_test_support.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using shardopt_test::file_bytes;
using shardopt_test::scratch;
using shardopt_test::seeded_values;
using shardopt_test::shard_files;
using shardopt_test::world;
namespace fs = std::filesystem;

namespace {

// One optimizer's parameters in any dtype: f32 values, or bf16 (the top half of the f32 bits).
struct AnyModel {
  DType dtype;
  std::vector<std::vector<char>> values;
  std::vector<std::vector<char>> grads;
  AnyModel(const std::vector<int64_t>& sizes, DType d, uint32_t seed) : dtype(d) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      values.push_back(encode(seeded_values(seed + static_cast<uint32_t>(i), sizes[i]), d));
      grads.emplace_back(values.back().size(), 0);
    }
  }
  static std::vector<char> encode(const std::vector<float>& f, DType d) {
    const std::size_t width = dtype_size(d);
    std::vector<char> out(f.size() * width);
    for (std::size_t i = 0; i < f.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &f[i], 4);
      if (d == DType::f32) std::memcpy(&out[i * 4], &bits, 4);
      else {
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&out[i * 2], &top, 2);
      }
    }
    return out;
  }
};

std::unique_ptr<ZeroOptimizer> make(const OptimizerConfig& config, AnyModel& model, const std::vector<int64_t>& sizes,
                                    bool freeze) {
  std::vector<ParamGroupSpec> groups(2);
  groups[0].hyper = shardopt_test::busy_hyperparams(config.algorithm);
  groups[1].hyper = groups[0].hyper;
  groups[1].hyper.lr = *groups[1].hyper.lr * 0.5;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ParamSpec p;
    p.name = "layer" + std::to_string(i) + ".weight";
    p.param = TensorRef{model.values[i].data(), sizes[i], model.dtype};
    if (config.storage == Storage::external) p.grad = TensorRef{model.grads[i].data(), sizes[i], model.dtype};
    groups[i < sizes.size() / 2 ? 0 : 1].params.push_back(p);
  }
  auto opt = std::make_unique<ZeroOptimizer>(world(), config, groups);
  if (freeze) opt->set_trainable(static_cast<ParamId>(sizes.size() - 2), false);
  return opt;
}

// Steps [from, to) with gradients that depend on step and param only; an LR change at step 4.
void train(ZeroOptimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      const TensorRef g = opt.grad_view(id);
      const auto bytes = AnyModel::encode(seeded_values(500u + static_cast<uint32_t>(s * 31 + id), g.numel), g.dtype);
      if (g.numel > 0) std::memcpy(g.data, bytes.data(), bytes.size());
    }
    if (s == 4) opt.hyperparams(0).lr *= 0.5;
    opt.step();
  }
}

std::string param_bytes(const ZeroOptimizer& opt) {
  std::string out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef v = opt.param_view(id);
    out.append(static_cast<const char*>(v.data), v.nbytes());
  }
  return out;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Rank 0: `b` holds byte for byte the checkpoint `a` holds, but for the save's identity (its
// save id, and the CRCs that cover it).
void require_same_checkpoint(const std::string& a, const std::string& b) {
  const std::string id_a = read_checkpoint_info(a).save_id;
  const std::string id_b = read_checkpoint_info(b).save_id;
  REQUIRE(id_a != id_b);
  const std::vector<std::string> files_a = shard_files(a), files_b = shard_files(b);
  REQUIRE(files_a.size() == files_b.size());
  for (std::size_t f = 0; f < files_a.size(); ++f) {
    CAPTURE(files_a[f]);
    REQUIRE(replace_all(files_a[f], id_a, id_b) == files_b[f]);
    REQUIRE(replace_all(file_bytes(a + "/" + files_a[f]), id_a, id_b) == file_bytes(b + "/" + files_b[f]));
  }
  auto normalised = [&](const std::string& dir, const std::string& id) {
    nlohmann::ordered_json m = nlohmann::ordered_json::parse(replace_all(file_bytes(dir + "/manifest.json"), id, "ID"));
    m.erase("manifest_crc32c");
    for (auto& f : m["files"]) f.erase("crc32c");
    return m.dump();
  };
  REQUIRE(normalised(a, id_a) == normalised(b, id_b));
  export_checkpoint(a, a + ".safetensors");
  export_checkpoint(b, b + ".safetensors");
  REQUIRE(file_bytes(a + ".safetensors") == file_bytes(b + ".safetensors"));
}

struct Case {
  const char* name;
  OptimizerConfig config;
  DType dtype;
  bool freeze;
  std::vector<int64_t> sizes;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  OptimizerConfig adamw;
  adamw.algorithm = Algorithm::adamw;
  adamw.bucket_bytes = 64;
  out.push_back({"adamw flat bucket_view, frozen param", adamw, DType::f32, true, shardopt_test::kSizes});
  OptimizerConfig sgd;
  sgd.algorithm = Algorithm::sgd;
  sgd.partition = PartitionStrategy::sorted_greedy;
  sgd.storage = Storage::external;
  out.push_back({"sgd sorted_greedy external", sgd, DType::f32, false, shardopt_test::kSizes});
  OptimizerConfig replicated;
  replicated.shard_state = false;
  out.push_back({"replicated adam", replicated, DType::f32, true, shardopt_test::kSizes});
  // bf16 values are widened in 2^20-element chunks: every rank's segment of the big param
  // spans more than one.
  const int64_t big = (int64_t{1} << 20) * world()->size() + 4099;
  out.push_back({"adam bf16, chunked widening", OptimizerConfig{}, DType::bf16, false, {5, big, 17, 3}});
  return out;
}

void set_file_size_limit(rlim_t bytes) {
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &limit) == 0);
  limit.rlim_cur = bytes;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
}

}  // namespace

TEST_CASE("save_async while steps go on writes what save writes at that step, and it resumes bitwise",
          "[checkpoint][async]") {
  const std::vector<Case> all = cases();
  for (std::size_t c = 0; c < all.size(); ++c) {
    const Case& k = all[c];
    CAPTURE(k.name);
    const std::string dir = scratch("async_same_" + std::to_string(c));
    AnyModel reference_model(k.sizes, k.dtype, 7);
    auto reference = make(k.config, reference_model, k.sizes, k.freeze);
    train(*reference, 0, 7);

    AnyModel blocking_model(k.sizes, k.dtype, 7);
    auto blocking = make(k.config, blocking_model, k.sizes, k.freeze);
    train(*blocking, 0, 3);
    blocking->save(dir + "/blocking");

    AnyModel async_model(k.sizes, k.dtype, 7);
    auto async = make(k.config, async_model, k.sizes, k.freeze);
    train(*async, 0, 3);
    const std::string at_save = param_bytes(*async);
    // A slow filesystem: the writer stops for a while with half of its file written, so steps
    // that did not wait for it would change what it has yet to write.
    ::setenv("SHARDOPT_TEST_SLOW_ASYNC_SAVE_MS", "200", 1);
    async->save_async(dir + "/async");
    train(*async, 3, 7);  // steps (and an LR change) while the save is pending
    ::unsetenv("SHARDOPT_TEST_SLOW_ASYNC_SAVE_MS");
    REQUIRE(param_bytes(*async) != at_save);
    // Before wait_save nothing is committed: the directory has no manifest yet.
    REQUIRE_FALSE(fs::exists(dir + "/async/manifest.json"));
    async->wait_save();
    REQUIRE(param_bytes(*async) == param_bytes(*reference));  // the save did not disturb training

    if (world()->rank() == 0) require_same_checkpoint(dir + "/blocking", dir + "/async");
    world()->barrier();

    AnyModel resumed_model(k.sizes, k.dtype, 99);
    auto resumed = make(k.config, resumed_model, k.sizes, false);
    resumed->load(dir + "/async");
    REQUIRE(param_bytes(*resumed) == at_save);
    train(*resumed, 3, 7);
    REQUIRE(param_bytes(*resumed) == param_bytes(*reference));
  }
}

TEST_CASE("a background save failing on one rank fails on every rank at wait_save, as save does",
          "[checkpoint][async][errors]") {
  const std::string dir = scratch("async_fail");
  const int failing = world()->size() - 1;
  OptimizerConfig config;
  AnyModel model(shardopt_test::kSizes, DType::f32, 11);
  auto opt = make(config, model, shardopt_test::kSizes, false);
  train(*opt, 0, 2);
  opt->save(dir);
  const std::string previous = param_bytes(*opt);
  const std::string manifest_before = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
  const std::size_t files_before = world()->rank() == 0 ? shard_files(dir).size() : 0;
  train(*opt, 2, 3);

  // The failing rank may write no file beyond 1 KiB: its shard file's data cannot be written.
  std::signal(SIGXFSZ, SIG_IGN);
  auto with_full_disk = [&](auto&& call) {
    if (world()->rank() == failing) set_file_size_limit(1024);
    auto result = shardopt_test::error_of(call);
    if (world()->rank() == failing) set_file_size_limit(RLIM_INFINITY);
    return result;
  };
  auto [save_code, save_message] = with_full_disk([&] { opt->save(dir); });
  auto [code, message] = with_full_disk([&] {
    opt->save_async(dir);  // the setup succeeds: the write fails in the background
    train(*opt, 3, 4);
    opt->wait_save();
  });
  REQUIRE(code == ErrorCode::io);
  REQUIRE(save_code == ErrorCode::io);
  // The same message as save's, but for the save's identity.
  const std::regex save_id("g[0-9]{6}-[0-9a-f]{8}");
  REQUIRE(std::regex_replace(message, save_id, "ID") == std::regex_replace(save_message, save_id, "ID"));
  REQUIRE(message.find("save to '" + dir + "'") != std::string::npos);
  REQUIRE(message.find("File too large") != std::string::npos);
  if (world()->rank() != failing) {
    REQUIRE(message.find("save failed on rank " + std::to_string(failing)) != std::string::npos);
  }

  // Each rank removes its own new file after the error: rank 0 looks once all have.
  world()->barrier();
  if (world()->rank() == 0) {
    REQUIRE(file_bytes(dir + "/manifest.json") == manifest_before);
    REQUIRE(shard_files(dir).size() == files_before);  // every rank removed its new file
    verify_checkpoint(dir);
  }
  world()->barrier();
  opt->wait_save();  // nothing pending any more: returns at once
  AnyModel fresh_model(shardopt_test::kSizes, DType::f32, 12);
  auto fresh = make(config, fresh_model, shardopt_test::kSizes, false);
  fresh->load(dir);
  REQUIRE(param_bytes(*fresh) == previous);

  // The optimizer saves in the background again once the disk has room.
  const std::string now = param_bytes(*opt);
  opt->save_async(dir);
  opt->wait_save();
  fresh->load(dir);
  REQUIRE(param_bytes(*fresh) == now);
}

TEST_CASE("save, save_async and load complete a pending background save; destroying the optimizer abandons it",
          "[checkpoint][async]") {
  const std::string dir = scratch("async_pending");
  OptimizerConfig config;
  AnyModel model(shardopt_test::kSizes, DType::f32, 5);
  auto opt = make(config, model, shardopt_test::kSizes, false);
  train(*opt, 0, 2);
  const std::string at_2 = param_bytes(*opt);
  opt->save_async(dir);
  train(*opt, 2, 3);
  opt->load(dir);  // commits the pending save first, then loads it
  REQUIRE(param_bytes(*opt) == at_2);
  REQUIRE(opt->param_step(0) == 2);

  // A second save_async commits the first before it starts.
  opt->save_async(dir);
  train(*opt, 2, 4);
  const std::string at_4 = param_bytes(*opt);
  opt->save_async(dir);
  train(*opt, 4, 5);
  if (world()->rank() == 0) REQUIRE(read_checkpoint_info(dir).max_step == 2);
  world()->barrier();
  opt->save(dir + "/../async_pending_other");  // commits the pending save of step 4 first
  if (world()->rank() == 0) REQUIRE(read_checkpoint_info(dir).max_step == 4);
  world()->barrier();

  // A save still pending when its optimizer goes away is abandoned: no manifest, no new files.
  const std::string manifest_before = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
  const std::size_t files_before = world()->rank() == 0 ? shard_files(dir).size() : 0;
  opt->save_async(dir);
  train(*opt, 5, 6);
  opt.reset();
  world()->barrier();
  if (world()->rank() == 0) {
    REQUIRE(file_bytes(dir + "/manifest.json") == manifest_before);
    REQUIRE(shard_files(dir).size() == files_before);
  }
  AnyModel fresh_model(shardopt_test::kSizes, DType::f32, 6);
  auto fresh = make(config, fresh_model, shardopt_test::kSizes, false);
  fresh->load(dir);
  REQUIRE(param_bytes(*fresh) == at_4);
}

TEST_CASE("a background save stopped before its manifest leaves the previous checkpoint intact",
          "[checkpoint][async][crash]") {
  const std::string dir = scratch("async_abort");
  OptimizerConfig config;
  AnyModel model(shardopt_test::kSizes, DType::f32, 8);
  auto opt = make(config, model, shardopt_test::kSizes, false);
  train(*opt, 0, 2);
  opt->save(dir);
  const std::string previous = param_bytes(*opt);
  const std::string manifest_before = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
  opt->save_async(dir);
  train(*opt, 2, 4);
  ::setenv("SHARDOPT_TEST_ABORT_SAVE_AFTER", "shards", 1);
  auto [code, message] = shardopt_test::error_of([&] { opt->wait_save(); });
  ::unsetenv("SHARDOPT_TEST_ABORT_SAVE_AFTER");
  REQUIRE(code == ErrorCode::internal);
  REQUIRE(message.find("SHARDOPT_TEST_ABORT_SAVE_AFTER") != std::string::npos);
  if (world()->rank() == 0) {
    REQUIRE(file_bytes(dir + "/manifest.json") == manifest_before);
    verify_checkpoint(dir);
  }
  AnyModel fresh_model(shardopt_test::kSizes, DType::f32, 9);
  auto fresh = make(config, fresh_model, shardopt_test::kSizes, false);
  fresh->load(dir);
  REQUIRE(param_bytes(*fresh) == previous);
}
