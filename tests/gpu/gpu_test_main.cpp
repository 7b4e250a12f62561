// tests/gpu/gpu_test_main.cpp — Catch2 runner for single-process GPU tests: skips (exit 77) when no CUDA device is usable.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "gpu_test_support.hpp"

int main(int argc, char** argv) {
  std::string reason;
  if (!shardopt_test::cuda_device_present(&reason)) {
    std::printf("SKIPPED: no CUDA device: %s\n", reason.c_str());
    return shardopt_test::kSkipExitCode;
  }
  return Catch::Session().run(argc, argv);
}
