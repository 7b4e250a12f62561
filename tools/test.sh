#!/usr/bin/env bash
# tools/test.sh — the README's test command: installs what is missing, builds (CUDA code too when the toolkit is present), runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install_deps.sh

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"

# Multi-rank tests run as root on CI machines, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
ctest --test-dir build --output-on-failure -j"$jobs"

# ---- sanitizers and fuzzing --------------------------------------------------------------------
# A second build with ASan + UBSan (float-cast-overflow included), CUDA off, running the unit and
# multi-rank tests (not python, benches, demos or the install test, so the tools are not built).
# LeakSanitizer runs on the unit tests; under MPI it is off: Open MPI's plugins leak at MPI_Finalize from modules it has
# already unloaded, which LSan reports as "<unknown module>" frames that no suppression can name.
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDOPT_WITH_CUDA=OFF -DSHARDOPT_SANITIZE=ON \
  -DSHARDOPT_BUILD_TOOLS=OFF
cmake --build build-sanitize -j"$jobs"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tools/sanitizer/ubsan.supp"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -L unit -LE 'mpi|bench|python'
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -L mpi \
  -LE 'python|bench|demo|install|gpu'

# The checkpoint readers' fuzz harnesses (clang, libFuzzer): the seed corpus replayed, then a
# bounded fuzzing run per harness; any crash fails.
SHARDOPT_FUZZ_SECONDS=${SHARDOPT_FUZZ_SECONDS:-60} bash tests/fuzz/run.sh build-fuzz

# ThreadSanitizer over the threaded paths (a clang build of the library and three test
# programs; tools/sanitizer/tsan.sh). Opt-in, as it adds a third build to CI's time.
if [[ ${SHARDOPT_TSAN:-0} == 1 ]]; then
  bash tools/sanitizer/tsan.sh build-tsan
fi
