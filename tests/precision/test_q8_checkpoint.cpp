// tests/precision/test_q8_checkpoint.cpp — 8-bit moments in sharded checkpoints: saved at N ranks, loaded at every world size up to N, continuing bitwise as a run that never saved; precision mismatches and damaged q8 files refused by name on every rank.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/manifest.hpp"
#include "mpi/mpi_test_support.hpp"
#include "precision.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::param_bytes;
using shardopt_test::world;

// 8-bit params (a partial last block, exactly 4096, several blocks) beside params under
// min_8bit_size, which keep fp32 moments in the same group.
const std::vector<int64_t> kSizes = {5000, 300, 4096, 8200, 17, 4500, 6000};

struct Setup {
  DType dtype = DType::f32;
  MasterStorage master = MasterStorage::fp32;
  int stage = 1;
  bool shard_state = true;
  StatePrecision group0 = StatePrecision::q8;
  StatePrecision group1 = StatePrecision::q8;
};

std::vector<uint16_t> narrow_all(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(dtype == DType::bf16 ? kernels::float_to_bf16(x) : kernels::float_to_f16(x));
  return out;
}

std::vector<char> as_bytes(const std::vector<float>& v, DType dtype) {
  std::vector<char> bytes(v.size() * dtype_size(dtype));
  if (dtype == DType::f32) std::memcpy(bytes.data(), v.data(), bytes.size());
  else std::memcpy(bytes.data(), narrow_all(v, dtype).data(), bytes.size());
  return bytes;
}

std::unique_ptr<ZeroOptimizer> make(std::shared_ptr<Communicator> comm, const Setup& s) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = PartitionStrategy::sorted_greedy;
  config.stage = s.stage;
  config.shard_state = s.shard_state;
  config.master = s.master;
  config.bucket_bytes = 4096;
  std::vector<ParamGroupSpec> groups(2);
  std::vector<std::vector<char>> init;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    init.push_back(as_bytes(shardopt_test::seeded_values(static_cast<uint32_t>(70 + i), kSizes[i]), s.dtype));
    groups[i % 2].params.push_back(
        ParamSpec{"q" + std::to_string(i), TensorRef{init.back().data(), kSizes[i], s.dtype, Device::cpu()}, TensorRef{}});
  }
  groups[0].hyper.lr = 1e-2;
  groups[0].hyper.weight_decay = 0.01;
  groups[0].settings.state_precision = s.group0;
  groups[1].hyper.lr = 3e-3;
  groups[1].hyper.beta2 = 0.99;
  groups[1].settings.state_precision = s.group1;
  return std::make_unique<ZeroOptimizer>(std::move(comm), config, groups);
}

// Gradients on a power-of-two grid (sums and averages over up to 4 ranks exact), the same on
// every rank, so every world size averages them to themselves.
void feed(ZeroOptimizer& opt, int step, const Setup& s) {
  opt.zero_grad();
  for (std::size_t j = kSizes.size(); j-- > 0;) {
    const ParamId id = opt.find_param("q" + std::to_string(j));
    std::vector<float> g = shardopt_test::seeded_values(static_cast<uint32_t>(700 * step + j), kSizes[j]);
    const float scale = std::ldexp(1.f, -static_cast<int>(j % 4) * 3);
    for (float& v : g) v = static_cast<float>(static_cast<int>(v * 16.f)) / 128.f * scale;
    const std::vector<char> bytes = as_bytes(g, s.dtype);
    if (s.stage == 2) {
      opt.reduce_gradient(id, TensorRef{const_cast<char*>(bytes.data()), kSizes[j], s.dtype, Device::cpu()});
    } else {
      std::memcpy(opt.grad_view(id).data, bytes.data(), bytes.size());
    }
  }
  opt.reduce_gradients();
  opt.step();
}

std::string scratch(const std::string& name) {
  // The staged runs (SHARDOPT_TEST_CKPT_STAGING_BYTES set) may run beside the plain ones.
  const char* staged = std::getenv("SHARDOPT_TEST_CKPT_STAGING_BYTES");
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/q8ckpt" + (staged != nullptr ? "_staged" : "") +
                          "_np" + std::to_string(world()->size()) + "/" + name;
  if (world()->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world()->barrier();
  return dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The path of shard file `index` of the checkpoint in `dir`.
std::string shard_file(const std::string& dir, int index) {
  const std::string tag = fmt::format("-{:05d}-of-", index);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("shard-", 0) == 0 && name.find(tag) != std::string::npos) return entry.path().string();
  }
  FAIL("no shard file " << index << " in " << dir);
  return "";
}

constexpr int kSavedAt = 3;
constexpr int kSteps = 6;

}  // namespace

TEST_CASE("q8 checkpoints: saved at N ranks, loaded at every world size, continue bitwise as a run that never saved",
          "[q8][checkpoint]") {
  struct Variant {
    DType dtype;
    MasterStorage master;
    int stage;
    bool shard_state;
    StatePrecision group1;
  };
  for (const Variant& v : {Variant{DType::f32, MasterStorage::fp32, 1, true, StatePrecision::q8},
                           Variant{DType::bf16, MasterStorage::remainder16, 2, true, StatePrecision::fp32},
                           Variant{DType::bf16, MasterStorage::fp32, 1, true, StatePrecision::q8},
                           Variant{DType::f32, MasterStorage::fp32, 1, false, StatePrecision::fp32}}) {
    CAPTURE(dtype_name(v.dtype), master_storage_name(v.master), v.stage, v.shard_state);
    Setup s;
    s.dtype = v.dtype;
    s.master = v.master;
    s.stage = v.stage;
    s.shard_state = v.shard_state;
    s.group1 = v.group1;
    const std::string dir =
        scratch(fmt::format("{}_{}_{}_{}", dtype_name(v.dtype), master_storage_name(v.master), v.stage, v.shard_state));
    auto reference = make(world(), s);
    for (int step = 0; step < kSteps; ++step) feed(*reference, step, s);
    auto saved = make(world(), s);
    for (int step = 0; step < kSavedAt; ++step) feed(*saved, step, s);
    // The background save writes the same bytes (half the variants take it).
    if (v.stage == 2 || !v.shard_state) {
      saved->save_async(dir);
      saved->wait_save();
    } else {
      saved->save(dir);
    }
    // The manifest names the 8-bit params (those of q8 groups at or above 4096 elements).
    const std::string manifest = read_text(dir + "/manifest.json");
    CHECK(manifest.find("\"state_precision\"") != std::string::npos);
    // Every world size from 1 to N at once: the ranks below k load at world k, the others at
    // world N - k (each split group loads the same files).
    for (int k = 1; k <= world()->size(); ++k) {
      const bool low = world()->rank() < k;
      auto sub = world()->split(low ? 0 : 1, world()->rank());
      CAPTURE(k, sub->size());
      auto resumed = make(sub, s);
      resumed->load(dir);
      REQUIRE(resumed->param_step(resumed->find_param("q3")) == kSavedAt);
      for (int step = kSavedAt; step < kSteps; ++step) feed(*resumed, step, s);
      REQUIRE(param_bytes(*resumed) == param_bytes(*reference));
    }
    // The saving optimizer itself goes on as if it had not saved.
    for (int step = kSavedAt; step < kSteps; ++step) feed(*saved, step, s);
    REQUIRE(param_bytes(*saved) == param_bytes(*reference));
    // And the continuation differs from a run that restarted its 8-bit moments from zero.
    auto restarted = make(world(), s);
    for (int step = kSavedAt; step < kSteps; ++step) feed(*restarted, step, s);
    REQUIRE(param_bytes(*restarted) != param_bytes(*reference));
  }
}

TEST_CASE("q8 checkpoints load only into the state precision they were saved with, refused by name on every rank",
          "[q8][checkpoint][errors]") {
  Setup q8;
  Setup fp32;
  fp32.group0 = fp32.group1 = StatePrecision::fp32;
  SECTION("8-bit moments into fp32 moments") {
    const std::string dir = scratch("into_fp32");
    auto saved = make(world(), q8);
    feed(*saved, 0, q8);
    saved->save(dir);
    auto other = make(world(), fp32);
    const auto [code, message] = error_of([&] { other->load(dir); });
    CHECK(code == ErrorCode::mismatch);
    CHECK_THAT(message, Catch::Contains("keeps the moments of 'q0' as 8-bit codes (state_precision q8)") &&
                            Catch::Contains("here its group 0 keeps fp32 moments"));
    // Nothing changed: it steps from its own fresh state.
    feed(*other, 0, fp32);
    CHECK(other->param_step(0) == 1);
  }
  SECTION("fp32 moments into 8-bit moments") {
    const std::string dir = scratch("into_q8");
    auto saved = make(world(), fp32);
    feed(*saved, 0, fp32);
    saved->save(dir);
    auto other = make(world(), q8);
    const auto [code, message] = error_of([&] { other->load(dir); });
    CHECK(code == ErrorCode::mismatch);
    CHECK_THAT(message, Catch::Contains("keeps the moments of 'q0' as fp32 values") &&
                            Catch::Contains("keeps 8-bit moments (state_precision q8)"));
  }
}

TEST_CASE("a damaged q8 shard file is refused by name on every rank, never a crash", "[q8][checkpoint][errors]") {
  Setup s;
  const std::string dir = scratch("damaged");
  auto saved = make(world(), s);
  feed(*saved, 0, s);
  saved->save(dir);
  // File 0 holds the largest 8-bit param (sorted_greedy's first pick), and the codes are the
  // file's last tensor: its last byte is an 8-bit code.
  const std::string path = shard_file(dir, 0);
  const std::string original = read_text(path);
  // Every rank has read the file before rank 0 rewrites it in a section below (a rank still
  // reading would see it truncated).
  world()->barrier();
  REQUIRE(original.find("\"U8\"") != std::string::npos);
  REQUIRE(original.find("exp_avg_sq.q8_codes") != std::string::npos);
  REQUIRE(original.find("\"format_version\":\"2\"") != std::string::npos);
  auto write = [&](const std::string& bytes) {
    if (world()->rank() == 0) std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    world()->barrier();
  };
  SECTION("a flipped code") {
    std::string bytes = original;
    bytes.back() = static_cast<char>(bytes.back() ^ 0x10);
    write(bytes);
    auto other = make(world(), s);
    const auto [code, message] = error_of([&] { other->load(dir); });
    CHECK(code == ErrorCode::corrupt);
    CHECK_THAT(message, Catch::Contains("is corrupt: CRC32C"));
  }
  SECTION("truncated inside the codes") {
    write(original.substr(0, original.size() - 100));
    auto other = make(world(), s);
    const auto [code, message] = error_of([&] { other->load(dir); });
    CHECK(code == ErrorCode::corrupt);
    CHECK_THAT(message, Catch::Contains("truncated"));
  }
}

TEST_CASE("q8 state dicts: torchao's codes and scale per 8-bit moment, consolidated at N ranks, loaded back bitwise",
          "[q8][state_dict]") {
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    Setup s;
    s.stage = stage;
    s.group1 = StatePrecision::fp32;
    auto opt = make(world(), s);
    for (int step = 0; step < kSavedAt; ++step) feed(*opt, step, s);
    opt->consolidate_state_dict(0);
    auto reference = make(world(), s);
    for (int step = 0; step < kSteps; ++step) feed(*reference, step, s);
    const auto solo = world()->split(world()->rank(), 0);  // collective: before the other ranks leave
    if (world()->rank() != 0) continue;
    const StateDict dict = opt->state_dict();
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      const ParamState& ps = dict.state.at(id);
      const int64_t n = opt->param_view(id).numel;
      const bool eight_bit = opt->param_group(id) == 0 && n >= 4096;
      CAPTURE(opt->param_name(id), n);
      CHECK(ps.step == kSavedAt);
      if (!eight_bit) {
        CHECK(ps.q8.empty());
        CHECK(ps.tensors.count("exp_avg") == 1);
        continue;
      }
      CHECK(ps.tensors.count("exp_avg") == 0);
      CHECK(ps.tensors.count("exp_avg_sq") == 0);
      REQUIRE(ps.q8.size() == 2);
      for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
        const Q8State& q = ps.q8.at(kind);
        REQUIRE(static_cast<int64_t>(q.codes.size()) == n);
        REQUIRE(static_cast<int64_t>(q.scale.size()) == (n + 255) / 256);
        // Real state: every block has a positive absmax, and the codes are not all one value.
        for (float absmax : q.scale) CHECK(absmax > 0.f);
        CHECK(std::any_of(q.codes.begin(), q.codes.end(), [&](uint8_t c) { return c != q.codes[0]; }));
      }
    }
    // The maps (torchao's qmap) are bitsandbytes' dynamic maps: ascending, ending at 1, the
    // signed one from just above -1.
    for (bool is_signed : {true, false}) {
      const std::vector<float> map = q8_map(is_signed);
      REQUIRE(map.size() == 256);
      CHECK(std::is_sorted(map.begin(), map.end()));
      CHECK(map.back() == 1.f);
      CHECK(map.front() == (is_signed ? -0.992968738f : 0.f));  // bitsandbytes: -0.99296875 rounded in float32
    }
    // Into a fresh one-rank optimizer whose parameters are the saved run's (the caller's to
    // restore, as torch's): it continues as the N-rank reference.
    auto replay = make(solo, s);
    for (int step = 0; step < kSavedAt; ++step) feed(*replay, step, s);
    auto resumed = make(solo, s);
    for (ParamId id = 0; id < resumed->num_params(); ++id) {
      const TensorRef from = replay->param_view(id);
      std::memcpy(resumed->param_view(id).data, from.data, from.nbytes());
    }
    resumed->load_state_dict(dict);
    for (int step = kSavedAt; step < kSteps; ++step) feed(*resumed, step, s);
    REQUIRE(param_bytes(*resumed) == param_bytes(*reference));
    // 8-bit state into fp32 moments, and a damaged 8-bit entry, refused by name.
    Setup fp32 = s;
    fp32.group0 = StatePrecision::fp32;
    auto other = make(solo, fp32);
    const auto [code, message] = error_of([&] { other->load_state_dict(dict); });
    CHECK(code == ErrorCode::mismatch);
    CHECK_THAT(message, Catch::Contains("parameter 'q0' has 8-bit 'exp_avg' in the state dict"));
    StateDict short_scale = dict;
    short_scale.state.at(0).q8.at("exp_avg_sq").scale.pop_back();
    const auto [short_code, short_message] = error_of([&] { resumed->load_state_dict(short_scale); });
    CHECK(short_code == ErrorCode::invalid_argument);
    CHECK_THAT(short_message, Catch::Contains("8-bit 'exp_avg_sq' of parameter 'q0' has 5000 codes and 19 scales"));
    StateDict as_fp32 = dict;
    as_fp32.state.at(0).q8.clear();
    as_fp32.state.at(0).tensors["exp_avg"].assign(5000, 0.f);
    const auto [fp32_code, fp32_message] = error_of([&] { resumed->load_state_dict(as_fp32); });
    CHECK(fp32_code == ErrorCode::mismatch);
    CHECK_THAT(fp32_message, Catch::Contains("keeps 8-bit moments here (state_precision q8), but the state dict holds "
                                             "its 'exp_avg' as fp32 values"));
  }
}

TEST_CASE("a manifest's q8 marks are checked: only whole, large Adam/AdamW params keep 8-bit moments",
          "[q8][checkpoint][errors]") {
  Setup s;
  const std::string dir = scratch("manifest");
  auto saved = make(world(), s);
  feed(*saved, 0, s);
  saved->save(dir);
  const checkpoint::Manifest m = checkpoint::read_manifest(dir);
  // In registration order (group 0: q0 q2 q4 q6, group 1: q1 q3 q5): all but q4 (17 elements)
  // and q1 (300) keep 8-bit moments.
  const std::vector<bool> expected = {true, true, false, true, false, true, true};
  REQUIRE(checkpoint::q8_params(m) == expected);
  checkpoint::check_manifest(m, "as saved");
  checkpoint::Manifest small = m;
  small.params[4].q8 = true;
  const auto [small_code, small_message] = error_of([&] { checkpoint::check_manifest(small, "edited"); });
  CHECK(small_code == ErrorCode::corrupt);
  CHECK_THAT(small_message, Catch::Contains("params[4] 'q1' says state_precision q8") &&
                                Catch::Contains("(it is trainable, adamw, 300 elements)"));
  // q3 (param 5) split in two segments of the same file: a save never writes that for an 8-bit param.
  checkpoint::Manifest split = m;
  for (checkpoint::ManifestFile& f : split.files) {
    for (std::size_t k = 0; k < f.segments.size(); ++k) {
      if (f.segments[k].param != 5) continue;
      partition::Segment second = f.segments[k];
      f.segments[k].length = 256;
      second.param_offset += 256;
      second.shard_offset += 256;
      second.length -= 256;
      f.segments.push_back(second);
      break;
    }
  }
  const auto [split_code, split_message] = error_of([&] { checkpoint::check_manifest(split, "edited"); });
  CHECK(split_code == ErrorCode::corrupt);
  CHECK_THAT(split_message, Catch::Contains("'q3' keeps 8-bit moments but lies in 2 segments"));
}
