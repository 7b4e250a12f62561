// tests/unit/test_q8_update.cpp — the fused 8-bit blockwise Adam/AdamW kernel against tools/gen_golden_q8.py's NumPy reference: codes and absmax exactly, parameters within 1 ulp over 20 steps, on every ISA variant.
#include <catch2/catch.hpp>

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/cpu_isa.hpp"
#include "cpu/kernel_table.hpp"
#include "cpu/q8_buckets.hpp"
#include "cpu/update_cpu.hpp"
#include "q8_state.hpp"
#include "shardopt/error.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

// One line of golden_q8.txt: `name count values...`.
struct Line {
  std::string name;
  std::vector<std::string> values;
};

std::vector<Line> read_golden() {
  const std::string path = std::string(SHARDOPT_TEST_DATA_DIR) + "/golden_q8.txt";
  std::ifstream in(path);
  if (!in) FAIL("cannot read " << path << " (tools/gen_golden_q8.py writes it)");
  std::vector<Line> lines;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream words(text);
    Line line;
    std::size_t count = 0;
    words >> line.name;
    if (line.name == "case" || line.name == "end") {
      std::string rest;
      words >> rest;
      line.values.push_back(rest);
      lines.push_back(line);
      continue;
    }
    words >> count;
    line.values.resize(count);
    for (std::string& v : line.values) words >> v;
    REQUIRE(words);
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<uint32_t> words_of(const Line& line) {
  std::vector<uint32_t> out;
  for (const std::string& v : line.values) out.push_back(static_cast<uint32_t>(std::stoul(v, nullptr, 16)));
  return out;
}

std::vector<float> floats_of(const Line& line) {
  std::vector<float> out;
  for (uint32_t w : words_of(line)) out.push_back(bits_float(w));
  return out;
}

struct Step {
  std::vector<float> grad, param, absmax1, absmax2;
  std::vector<uint32_t> codes1, codes2;
};

struct GoldenCase {
  std::string name;
  int64_t numel = 0;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool decoupled = false, maximize = false;
  std::vector<float> init;
  std::vector<Step> steps;
};

std::vector<GoldenCase> golden_cases(std::vector<uint32_t>& map_signed, std::vector<uint32_t>& map_unsigned) {
  std::vector<GoldenCase> cases;
  for (const Line& line : read_golden()) {
    if (line.name == "map_signed") map_signed = words_of(line);
    else if (line.name == "map_unsigned") map_unsigned = words_of(line);
    else if (line.name == "case") {
      cases.emplace_back();
      cases.back().name = line.values[0];
    }
    else if (line.name == "end") continue;
    else {
      GoldenCase& c = cases.back();
      const std::string& first = line.values.at(0);
      if (line.name == "numel") c.numel = std::stoll(first);
      else if (line.name == "hyper_lr") c.lr = std::strtod(first.c_str(), nullptr);
      else if (line.name == "hyper_beta1") c.beta1 = std::strtod(first.c_str(), nullptr);
      else if (line.name == "hyper_beta2") c.beta2 = std::strtod(first.c_str(), nullptr);
      else if (line.name == "hyper_eps") c.eps = std::strtod(first.c_str(), nullptr);
      else if (line.name == "hyper_weight_decay") c.weight_decay = std::strtod(first.c_str(), nullptr);
      else if (line.name == "hyper_decoupled") c.decoupled = first == "1";
      else if (line.name == "hyper_maximize") c.maximize = first == "1";
      else if (line.name == "init") c.init = floats_of(line);
      else if (line.name == "grad") {
        c.steps.emplace_back();
        c.steps.back().grad = floats_of(line);
      }
      else if (line.name == "param") c.steps.back().param = floats_of(line);
      else if (line.name == "exp_avg_codes") c.steps.back().codes1 = words_of(line);
      else if (line.name == "exp_avg_absmax") c.steps.back().absmax1 = floats_of(line);
      else if (line.name == "exp_avg_sq_codes") c.steps.back().codes2 = words_of(line);
      else if (line.name == "exp_avg_sq_absmax") c.steps.back().absmax2 = floats_of(line);
    }
  }
  return cases;
}

int64_t ulps_apart(float a, float b) {
  // Both finite here; order the bit patterns so that adjacent floats differ by 1.
  auto ordered = [](float x) {
    const auto u = static_cast<int64_t>(float_bits(x));
    return u & 0x80000000 ? -(u & 0x7fffffff) : u;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

std::vector<const CpuKernelTable*> runnable_variants() {
  std::vector<const CpuKernelTable*> out;
  const CpuFeatures cpu = detect_cpu_features();
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (cpu_isa_compiled(isa) && cpu_runs_isa(isa, cpu)) out.push_back(&cpu_kernel_table(isa));
  }
  return out;
}

}  // namespace

TEST_CASE("q8: the kernels' maps are the reference's (bitsandbytes' create_dynamic_map), midpoints included", "[q8]") {
  std::vector<uint32_t> map_signed, map_unsigned;
  golden_cases(map_signed, map_unsigned);
  REQUIRE(map_signed == std::vector<uint32_t>(std::begin(kQ8SignedMap), std::end(kQ8SignedMap)));
  REQUIRE(map_unsigned == std::vector<uint32_t>(std::begin(kQ8UnsignedMap), std::end(kQ8UnsignedMap)));
  for (int i = 0; i < 255; ++i) {
    REQUIRE(float_bits((bits_float(kQ8SignedMap[i]) + bits_float(kQ8SignedMap[i + 1])) / 2.f) == kQ8SignedBounds[i]);
    REQUIRE(float_bits((bits_float(kQ8UnsignedMap[i]) + bits_float(kQ8UnsignedMap[i + 1])) / 2.f) ==
            kQ8UnsignedBounds[i]);
  }
  // Signed: from the mean of the top interval's first two boundaries, negated (-0.99297), to an
  // appended 1 (bitsandbytes' map is not symmetric), with an exact 0; unsigned: 0 .. 1.
  CHECK(bits_float(kQ8SignedMap[0]) > -1.f);
  CHECK(bits_float(kQ8SignedMap[0]) < -0.99f);
  CHECK(std::count(std::begin(kQ8SignedMap), std::end(kQ8SignedMap), 0u) == 1);
  CHECK(bits_float(kQ8SignedMap[255]) == 1.f);
  CHECK(bits_float(kQ8UnsignedMap[0]) == 0.f);
  CHECK(bits_float(kQ8UnsignedMap[255]) == 1.f);
  // The nearest-code search: ties to the lower code, beyond the ends to the ends, NaN to 255.
  CHECK(q8_nearest_code(kQ8SignedBounds, bits_float(kQ8SignedBounds[17])) == 17);
  CHECK(q8_nearest_code(kQ8SignedBounds, -2.f) == 0);
  CHECK(q8_nearest_code(kQ8SignedBounds, 2.f) == 255);
  CHECK(q8_nearest_code(kQ8SignedBounds, NAN) == 255);
}

TEST_CASE("q8: 20 fused steps give the reference's codes and absmax exactly, parameters within 1 ulp, on every ISA",
          "[q8]") {
  std::vector<uint32_t> map_signed, map_unsigned;
  const std::vector<GoldenCase> cases = golden_cases(map_signed, map_unsigned);
  REQUIRE(cases.size() == 2);
  for (const GoldenCase& c : cases) {
    REQUIRE(c.steps.size() == 20);
    std::vector<std::vector<float>> params_by_variant;
    for (const CpuKernelTable* variant : runnable_variants()) {
      CAPTURE(c.name, cpu_isa_name(variant->isa));
      const auto n = static_cast<std::size_t>(c.numel);
      std::vector<float> param = c.init;
      std::vector<uint8_t> codes1(n, 0), codes2(n, 0);
      std::vector<float> absmax1(static_cast<std::size_t>(q8_blocks(c.numel)), 0.f), absmax2(absmax1);
      int64_t worst_ulps = 0;
      for (std::size_t t = 0; t < c.steps.size(); ++t) {
        const Step& step = c.steps[t];
        const AdamScalars s = make_adam_scalars(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.decoupled, false,
                                                c.maximize, static_cast<int64_t>(t + 1));
        const UpdateTensors tensors{param.data(), step.grad.data(), nullptr, DType::f32};
        const Q8Moments q{codes1.data(), codes2.data(), absmax1.data(), absmax2.data()};
        variant->adam_update_q8(tensors, q, c.numel, s, GradTransform{}, Rounding{}, 2);
        CAPTURE(t);
        REQUIRE(std::vector<uint32_t>(codes1.begin(), codes1.end()) == step.codes1);
        REQUIRE(std::vector<uint32_t>(codes2.begin(), codes2.end()) == step.codes2);
        for (std::size_t b = 0; b < absmax1.size(); ++b) {
          REQUIRE(float_bits(absmax1[b]) == float_bits(step.absmax1[b]));
          REQUIRE(float_bits(absmax2[b]) == float_bits(step.absmax2[b]));
        }
        for (std::size_t i = 0; i < n; ++i) worst_ulps = std::max(worst_ulps, ulps_apart(param[i], step.param[i]));
        REQUIRE(worst_ulps <= 1);
      }
      params_by_variant.push_back(param);
    }
    // Every variant gives the same bits (not just within the ulp of the reference).
    for (const std::vector<float>& p : params_by_variant) REQUIRE(p == params_by_variant.front());
  }
}

TEST_CASE("q8: the public entry point refuses amsgrad and missing buffers", "[q8]") {
  std::vector<float> p(8), g(8, 0.5f), a(1);
  std::vector<uint8_t> c(8);
  const UpdateTensors t{p.data(), g.data(), nullptr, DType::f32};
  AdamScalars s = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, true, false, 1);
  auto message_of = [](const auto& call) -> std::string {
    try {
      call();
    } catch (const shardopt::Error& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(message_of([&] { adam_update_q8_cpu(t, Q8Moments{c.data(), c.data(), a.data(), a.data()}, 8, s, {}, {}, 1); }),
             Catch::Contains("amsgrad keeps max_exp_avg_sq"));
  s.amsgrad = false;
  CHECK_THAT(message_of([&] { adam_update_q8_cpu(t, Q8Moments{c.data(), nullptr, a.data(), a.data()}, 8, s, {}, {}, 1); }),
             Catch::Contains("`exp_avg_sq` is null"));
  adam_update_q8_cpu(t, Q8Moments{c.data(), c.data(), a.data(), a.data()}, 8, s, {}, {}, 1);
  CHECK(a[0] > 0.f);
}

TEST_CASE("q8: the bucket lookup finds the binary search's code for every float in [-1, 1] (a stride) and the edges",
          "[q8]") {
  using cpu_loops::q8_bucket_code;
  std::vector<uint32_t> patterns;
  // Every 97th pattern of [0, 1] and [-1, -0] (about 21 million values each side), every
  // midpoint and its neighbours, the ends and both zeros.
  for (uint32_t u = 0; u <= 0x3f800000u; u += 97) {
    patterns.push_back(u);
    patterns.push_back(u | 0x80000000u);
  }
  for (const uint32_t* bounds : {kQ8SignedBounds, kQ8UnsignedBounds}) {
    for (int i = 0; i < 255; ++i) {
      for (int d = -2; d <= 2; ++d) {
        const uint32_t u = bounds[i] + static_cast<uint32_t>(d);
        patterns.push_back(u);
        patterns.push_back(u ^ 0x80000000u);
      }
    }
  }
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x00000001u, 0x80000001u}) patterns.push_back(u);
  int64_t wrong_signed = 0, wrong_unsigned = 0;
  for (uint32_t u : patterns) {
    const float x = bits_float(u);
    if (!(x >= -1.f && x <= 1.f)) continue;
    wrong_signed += q8_bucket_code(u, cpu_loops::kQ8SignedBucketTable, cpu_loops::kQ8SignedBuckets) !=
                    q8_nearest_code(kQ8SignedBounds, x);
    wrong_unsigned += q8_bucket_code(u, cpu_loops::kQ8UnsignedBucketTable, cpu_loops::kQ8UnsignedBuckets) !=
                      q8_nearest_code(kQ8UnsignedBounds, x);
  }
  CHECK(wrong_signed == 0);
  CHECK(wrong_unsigned == 0);
}

TEST_CASE("q8: every ISA variant writes the same codes, absmax and parameters, NaN, inf, subnormals and ties included",
          "[q8]") {
  // 4 full blocks and a partial one; moments built so that their scaled values hit the maps'
  // midpoints exactly (ties), subnormal and zero blocks, a NaN and an inf gradient.
  const int64_t n = 4 * kQ8Block + 77;
  const auto un = static_cast<std::size_t>(n);
  std::vector<float> param0(un), grad(un);
  uint32_t state = 12345u;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.f - 0.5f;
  };
  for (std::size_t i = 0; i < un; ++i) {
    param0[i] = next();
    grad[i] = next() * 1e-2f;
  }
  for (std::size_t i = 0; i < 256; ++i) grad[256 + i] = bits_float(kQ8SignedBounds[i % 255]);  // midpoints
  for (std::size_t i = 0; i < 256; ++i) grad[512 + i] = bits_float(static_cast<uint32_t>(i + 1));  // subnormals
  for (std::size_t i = 0; i < 256; ++i) grad[768 + i] = 0.f;
  grad[40] = NAN;
  grad[1030] = INFINITY;
  std::vector<std::vector<uint8_t>> codes_by_variant;
  std::vector<std::vector<float>> floats_by_variant;
  for (const CpuKernelTable* variant : runnable_variants()) {
    CAPTURE(cpu_isa_name(variant->isa));
    std::vector<float> param = param0;
    std::vector<uint8_t> c1(un, 0), c2(un, 0);
    std::vector<float> a1(static_cast<std::size_t>(q8_blocks(n)), 0.f), a2(a1);
    for (int t = 1; t <= 3; ++t) {
      for (bool decoupled : {false, true}) {
        const AdamScalars s = make_adam_scalars(1e-2, 0.9, 0.999, 1e-8, 0.01, decoupled, false, false, t);
        const UpdateTensors tensors{param.data(), grad.data(), nullptr, DType::f32};
        variant->adam_update_q8(tensors, Q8Moments{c1.data(), c2.data(), a1.data(), a2.data()}, n, s, GradTransform{},
                                Rounding{}, 1);
      }
    }
    std::vector<uint8_t> codes = c1;
    codes.insert(codes.end(), c2.begin(), c2.end());
    codes_by_variant.push_back(codes);
    std::vector<float> floats = param;
    floats.insert(floats.end(), a1.begin(), a1.end());
    floats.insert(floats.end(), a2.begin(), a2.end());
    floats_by_variant.push_back(floats);
    CHECK(std::isnan(a1[0]));  // the NaN gradient's block
    CHECK(c1[40] == 255);
  }
  for (std::size_t v = 1; v < codes_by_variant.size(); ++v) {
    REQUIRE(codes_by_variant[v] == codes_by_variant[0]);
    const std::vector<float>& a = floats_by_variant[v];
    const std::vector<float>& b = floats_by_variant[0];
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(v, i);
      // NaN where the baseline has NaN; its sign and payload are not compared: when both operands
      // of an operation are NaN, IEEE 754 leaves which one propagates open, and a compiler may
      // commute the operands differently per variant (clang does here for a block whose state
      // went NaN). Every other value is compared bit for bit.
      if (a[i] != a[i] && b[i] != b[i]) continue;
      REQUIRE(float_bits(a[i]) == float_bits(b[i]));
    }
  }
}
