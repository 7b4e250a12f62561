// tests/unit/test_cpu_isa_select.cpp — choosing the CPU kernels' ISA variant: the default, SHARDOPT_CPU_ISA forcing one, and the errors for one the CPU lacks or an unknown name.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/cpu_isa.hpp"
#include "cpu/kernel_table.hpp"
#include "cpu/update_cpu.hpp"
#include "shardopt/error.hpp"
#include "shardopt/types.hpp"

using namespace shardopt::kernels;
using shardopt::Error;
using shardopt::ErrorCode;

namespace {

CpuFeatures no_features() { return CpuFeatures{}; }

CpuFeatures avx2_features() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}

CpuFeatures avx512_features() {
  CpuFeatures f = avx2_features();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}

// The code and message of what f throws; Error(internal, "nothing thrown") when it does not.
template <typename F>
Error error_of(const F& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::internal, "nothing thrown");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool x86_variants() { return cpu_isa_compiled(CpuIsa::avx2) && cpu_isa_compiled(CpuIsa::avx512); }

}  // namespace

TEST_CASE("ISA names round-trip and unset, empty or auto pick the fastest variant the CPU runs", "[cpu-isa]") {
  REQUIRE(std::string(cpu_isa_name(CpuIsa::baseline)) == "baseline");
  REQUIRE(std::string(cpu_isa_name(CpuIsa::avx2)) == "avx2");
  REQUIRE(std::string(cpu_isa_name(CpuIsa::avx512)) == "avx512");
  REQUIRE(cpu_isa_compiled(CpuIsa::baseline));
  for (const char* unset : {static_cast<const char*>(nullptr), "", "auto", "AUTO"}) {
    CAPTURE(unset ? unset : "(null)");
    REQUIRE(select_cpu_isa(unset, no_features()) == CpuIsa::baseline);
    REQUIRE(select_cpu_isa(unset, avx2_features()) == (x86_variants() ? CpuIsa::avx2 : CpuIsa::baseline));
    REQUIRE(select_cpu_isa(unset, avx512_features()) == (x86_variants() ? CpuIsa::avx512 : CpuIsa::baseline));
  }
  // One missing feature is enough to rule a variant out.
  CpuFeatures no_fma = avx512_features();
  no_fma.fma = false;
  REQUIRE(select_cpu_isa(nullptr, no_fma) == CpuIsa::baseline);
  CpuFeatures no_vl = avx512_features();
  no_vl.avx512vl = false;
  REQUIRE(select_cpu_isa(nullptr, no_vl) == (x86_variants() ? CpuIsa::avx2 : CpuIsa::baseline));
}

TEST_CASE("SHARDOPT_CPU_ISA forces a variant the CPU runs, in any case", "[cpu-isa]") {
  REQUIRE(select_cpu_isa("baseline", no_features()) == CpuIsa::baseline);
  REQUIRE(select_cpu_isa("baseline", avx512_features()) == CpuIsa::baseline);
  if (!x86_variants()) return;
  REQUIRE(select_cpu_isa("avx2", avx512_features()) == CpuIsa::avx2);
  REQUIRE(select_cpu_isa("AVX2", avx2_features()) == CpuIsa::avx2);
  REQUIRE(select_cpu_isa("avx512", avx512_features()) == CpuIsa::avx512);
}

TEST_CASE("SHARDOPT_CPU_ISA naming a variant the CPU lacks is Error(unsupported) naming it, what is missing and "
          "what the CPU runs",
          "[cpu-isa]") {
  const Error avx512 = error_of([] { select_cpu_isa("avx512", avx2_features()); });
  REQUIRE(avx512.code() == ErrorCode::unsupported);
  const std::string message = avx512.what();
  CAPTURE(message);
  REQUIRE(contains(message, "SHARDOPT_CPU_ISA=avx512"));
  if (x86_variants()) {
    REQUIRE(contains(message, "lacks avx512f avx512bw avx512vl avx512dq"));
    REQUIRE(contains(message, "it runs: baseline, avx2"));
  } else {
    REQUIRE(contains(message, "this build of shardopt has no avx512 kernels"));
  }

  const Error avx2 = error_of([] { select_cpu_isa("avx2", no_features()); });
  REQUIRE(avx2.code() == ErrorCode::unsupported);
  if (x86_variants()) REQUIRE(contains(avx2.what(), "lacks avx2 fma f16c); it runs: baseline"));

  CpuFeatures no_f16c = avx2_features();
  no_f16c.f16c = false;
  const Error partial = error_of([&] { select_cpu_isa("avx2", no_f16c); });
  REQUIRE(partial.code() == ErrorCode::unsupported);
  if (x86_variants()) REQUIRE(contains(partial.what(), "lacks f16c)"));
}

TEST_CASE("an unknown SHARDOPT_CPU_ISA is Error(invalid_argument) listing the accepted names", "[cpu-isa]") {
  for (const char* bad : {"sse9", "avx", "avx-512", " avx2"}) {
    CAPTURE(bad);
    const Error e = error_of([&] { select_cpu_isa(bad, avx512_features()); });
    REQUIRE(e.code() == ErrorCode::invalid_argument);
    REQUIRE(contains(e.what(), std::string("SHARDOPT_CPU_ISA=") + bad));
    REQUIRE(contains(e.what(), "baseline, avx2, avx512 or auto"));
  }
}

TEST_CASE("the table of a variant this CPU cannot run is refused, never executed", "[cpu-isa]") {
  const CpuFeatures cpu = detect_cpu_features();
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    CAPTURE(cpu_isa_name(isa));
    if (cpu_isa_compiled(isa) && cpu_runs_isa(isa, cpu)) {
      REQUIRE(cpu_kernel_table(isa).isa == isa);
      REQUIRE(missing_cpu_features(isa, cpu).empty());
    } else {
      REQUIRE(error_of([&] { cpu_kernel_table(isa); }).code() == ErrorCode::unsupported);
    }
  }
}

// Run by CTest in processes of their own, with SHARDOPT_CPU_ISA set (tests/unit/CMakeLists.txt):
// the process's choice is made once, so each value needs a fresh process.
TEST_CASE("SHARDOPT_CPU_ISA from the environment: the forced variant runs, or every kernel call fails cleanly",
          "[.cpu-isa-env]") {
  const char* value = std::getenv("SHARDOPT_CPU_ISA");
  REQUIRE(value != nullptr);
  const std::string name = value;
  CAPTURE(name);
  std::vector<float> p(100, 1.f), g(100, 0.5f), m(100, 0.f), v(100, 0.f);
  const AdamScalars adam = make_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, false, false, false, 1);
  const auto step = [&] { adam_update_cpu(p.data(), g.data(), m.data(), v.data(), nullptr, 100, adam, 1); };

  ErrorCode expected = ErrorCode::invalid_argument;  // an unknown name
  for (int i = 0; i < kCpuIsaCount; ++i) {
    const CpuIsa isa = static_cast<CpuIsa>(i);
    if (name != cpu_isa_name(isa)) continue;
    if (!cpu_isa_compiled(isa) || !cpu_runs_isa(isa, detect_cpu_features())) {
      expected = ErrorCode::unsupported;
      break;
    }
    // A variant this CPU runs: it is the one in use, and it updates.
    REQUIRE(std::string(shardopt::cpu_kernel_isa()) == name);
    REQUIRE(active_cpu_kernels().isa == isa);
    step();
    REQUIRE(p[0] < 1.f);
    return;
  }
  // Not runnable or unknown: the same error from the query and from every kernel, each time.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Error query = error_of([] { shardopt::cpu_kernel_isa(); });
    REQUIRE(query.code() == expected);
    REQUIRE(contains(query.what(), "SHARDOPT_CPU_ISA=" + name));
    REQUIRE(error_of(step).code() == expected);
    REQUIRE(error_of([&] { grad_stats_cpu(g.data(), shardopt::DType::f32, 100, 1.f, false, 1); }).code() == expected);
  }
  REQUIRE(p[0] == 1.f);
}
