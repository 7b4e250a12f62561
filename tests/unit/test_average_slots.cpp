// tests/unit/test_average_slots.cpp — average_slots_cpu, the node's gradient reduction: the fixed binomial-tree order of a reduce to rank 0 with each pairwise sum rounded to the dtype, the same bits on every ISA variant, outputs aliasing inputs.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_isa.hpp"
#include "cpu/kernel_table.hpp"
#include "cpu/update_cpu.hpp"
#include "precision.hpp"
#include "shardopt/error.hpp"

using namespace shardopt::kernels;
using shardopt::DType;

namespace {

float widen_one(const std::vector<uint8_t>& buffer, int64_t i, DType dtype) {
  if (dtype == DType::f32) {
    float x;
    std::memcpy(&x, buffer.data() + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, buffer.data() + 2 * i, 2);
  return dtype == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

float round_to(float x, DType dtype) {
  if (dtype == DType::f32) return x;
  return dtype == DType::bf16 ? bf16_to_float(float_to_bf16(x)) : f16_to_float(float_to_f16(x));
}

// The order written out as MPI's binomial reduce to rank 0 runs it: in round r, every rank
// that is a multiple of 2^r adds the partial sum of rank + 2^(r-1) to its own.
float binomial_reference(const std::vector<std::vector<uint8_t>>& slots, int64_t i, DType dtype) {
  std::vector<float> partial;
  for (const auto& slot : slots) partial.push_back(widen_one(slot, i, dtype));
  const int n = static_cast<int>(slots.size());
  for (int step = 1; step < n; step *= 2) {
    for (int r = 0; r + step < n; r += 2 * step) partial[r] = round_to(partial[r] + partial[r + step], dtype);
  }
  return partial[0];
}

std::vector<uint8_t> random_slot(uint32_t seed, int64_t n, DType dtype) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  const std::size_t width = dtype == DType::f32 ? 4 : 2;
  std::vector<uint8_t> out(static_cast<std::size_t>(n) * width);
  for (int64_t i = 0; i < n; ++i) {
    const float x = dist(gen);
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("average_slots_cpu adds in a binomial reduce's order, rounds each sum to the dtype, writes every output",
          "[cpu-isa][average-slots]") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    // 1-8: the one-pass loop; 11 and 17: the block path.
    for (int count : {1, 2, 3, 4, 5, 6, 7, 8, 11, 17}) {
      for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1025}, int64_t{70001}}) {
        CAPTURE(static_cast<int>(dtype), count, n);
        std::vector<std::vector<uint8_t>> slots;
        for (int r = 0; r < count; ++r) slots.push_back(random_slot(static_cast<uint32_t>(100 * count + r), n, dtype));
        const std::vector<std::vector<uint8_t>> before = slots;
        // In place, as the optimizer calls it: every slot is an input and an output.
        std::vector<const void*> inputs;
        std::vector<void*> outputs;
        for (auto& slot : slots) {
          inputs.push_back(slot.data());
          outputs.push_back(slot.data());
        }
        const float divisor = static_cast<float>(count);
        average_slots_cpu(inputs.data(), count, outputs.data(), count, dtype, n, divisor, 2);
        for (int64_t i = 0; i < n; ++i) {
          const float expected = round_to(binomial_reference(before, i, dtype) / divisor, dtype);
          for (int r = 0; r < count; ++r) {
            const float got = widen_one(slots[static_cast<std::size_t>(r)], i, dtype);
            if (std::memcmp(&got, &expected, 4) != 0) {
              FAIL_CHECK("element " << i << " of slot " << r << ": " << got << ", expected " << expected);
              return;
            }
          }
        }
      }
    }
  }
}

TEST_CASE("every ISA variant averages slots with the baseline's bits", "[cpu-isa][variants][average-slots]") {
  const CpuFeatures cpu = detect_cpu_features();
  const CpuKernelTable& base = cpu_kernel_table(CpuIsa::baseline);
  for (int i = 1; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (!cpu_isa_compiled(isa) || !cpu_runs_isa(isa, cpu)) continue;
    const CpuKernelTable& variant = cpu_kernel_table(isa);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (int count : {2, 3, 5, 11}) {  // 11: the block path
        const int64_t n = 4099;
        std::vector<std::vector<uint8_t>> inputs_storage;
        std::vector<const void*> inputs;
        for (int r = 0; r < count; ++r) inputs_storage.push_back(random_slot(static_cast<uint32_t>(7 + r), n, dtype));
        for (auto& s : inputs_storage) inputs.push_back(s.data());
        std::vector<uint8_t> out_base(inputs_storage[0].size()), out_variant(inputs_storage[0].size());
        void* base_out = out_base.data();
        void* variant_out = out_variant.data();
        base.average_slots(inputs.data(), count, &base_out, 1, dtype, n, 3.0f, 1);
        variant.average_slots(inputs.data(), count, &variant_out, 1, dtype, n, 3.0f, 2);
        CAPTURE(static_cast<int>(isa), static_cast<int>(dtype), count);
        REQUIRE(out_base == out_variant);
      }
    }
  }
}

TEST_CASE("average_slots_cpu refuses null buffers and a count out of range by name", "[average-slots]") {
  float a = 1.f;
  const void* inputs[] = {&a, nullptr};
  void* outputs[] = {&a};
  REQUIRE_THROWS_WITH(average_slots_cpu(inputs, 2, outputs, 1, DType::f32, 1, 2.f, 1),
                      Catch::Contains("average_slots_cpu") && Catch::Contains("inputs[i]"));
  REQUIRE_THROWS_WITH(average_slots_cpu(inputs, 0, outputs, 1, DType::f32, 1, 2.f, 1),
                      Catch::Contains("0 inputs"));
}

TEST_CASE("large f32 outputs apart from the inputs (streamed past the caches) get the in-place average's bits",
          "[cpu-isa][variants][average-slots]") {
  // Over 1 MiB of f32 with outputs that alias no input: the streaming-store path. Outputs one
  // element past an aligned address, so its plain-store head and tail run too.
  const CpuFeatures cpu = detect_cpu_features();
  const int64_t n = 300007;
  const int count = 3;
  std::vector<std::vector<uint8_t>> in_place;
  for (int r = 0; r < count; ++r) in_place.push_back(random_slot(static_cast<uint32_t>(41 + r), n, DType::f32));
  const std::vector<std::vector<uint8_t>> inputs_storage = in_place;
  std::vector<const void*> in_place_inputs;
  std::vector<void*> in_place_outputs;
  for (auto& slot : in_place) {
    in_place_inputs.push_back(slot.data());
    in_place_outputs.push_back(slot.data());
  }
  average_slots_cpu(in_place_inputs.data(), count, in_place_outputs.data(), count, DType::f32, n, 3.0f, 1);
  std::vector<const void*> inputs;
  for (const auto& s : inputs_storage) inputs.push_back(s.data());
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (!cpu_isa_compiled(isa) || !cpu_runs_isa(isa, cpu)) continue;
    std::vector<float> first(static_cast<std::size_t>(n) + 1, -1.f), second(static_cast<std::size_t>(n) + 1, -1.f);
    void* outputs[2] = {first.data() + 1, second.data() + 1};
    cpu_kernel_table(isa).average_slots(inputs.data(), count, outputs, 2, DType::f32, n, 3.0f, 2);
    CAPTURE(static_cast<int>(isa));
    REQUIRE(first[0] == -1.f);
    REQUIRE(std::memcmp(first.data() + 1, in_place[0].data(), static_cast<std::size_t>(n) * 4) == 0);
    REQUIRE(std::memcmp(second.data() + 1, in_place[0].data(), static_cast<std::size_t>(n) * 4) == 0);
  }
}

TEST_CASE("outputs apart from the inputs, one or several, get the in-place average's bits",
          "[average-slots]") {
  // Below the streaming size: 1 and 3 outputs (the one-pass loop), 2 (neither 1 nor one per
  // input: the block path).
  const int count = 3;
  const int64_t n = 5003;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::vector<uint8_t>> in_place;
    for (int r = 0; r < count; ++r) in_place.push_back(random_slot(static_cast<uint32_t>(90 + r), n, dtype));
    const std::vector<std::vector<uint8_t>> inputs_storage = in_place, original = in_place;
    std::vector<const void*> in_place_inputs;
    std::vector<void*> in_place_outputs;
    for (auto& slot : in_place) {
      in_place_inputs.push_back(slot.data());
      in_place_outputs.push_back(slot.data());
    }
    average_slots_cpu(in_place_inputs.data(), count, in_place_outputs.data(), count, dtype, n, 3.0f, 1);
    std::vector<const void*> inputs;
    for (const auto& s : inputs_storage) inputs.push_back(s.data());
    for (int output_count : {1, 2, 3}) {
      std::vector<std::vector<uint8_t>> outputs_storage(static_cast<std::size_t>(output_count),
                                                        std::vector<uint8_t>(inputs_storage[0].size(), 0xab));
      std::vector<void*> outputs;
      for (auto& o : outputs_storage) outputs.push_back(o.data());
      average_slots_cpu(inputs.data(), count, outputs.data(), output_count, dtype, n, 3.0f, 2);
      CAPTURE(static_cast<int>(dtype), output_count);
      for (const auto& o : outputs_storage) REQUIRE(o == in_place[0]);
      REQUIRE(inputs_storage == original);  // the inputs were left as they were
    }
  }
}
