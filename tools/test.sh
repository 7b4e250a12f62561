#!/usr/bin/env bash
# tools/test.sh — the README's test command: installs what is missing, builds (CUDA code too when the toolkit is present), runs every test, and prints where the time went.
#
#   bash tools/test.sh            SHARDOPT_FUZZ_SECONDS (default 60) per fuzz harness;
#                                 SHARDOPT_TSAN=1 adds the ThreadSanitizer build and its tests.
# Stages, in order (each builds only what it runs): packages; the release build (everything:
# library, tools, benchmarks, tests, CUDA code); its tests (ctest); the ASan+UBSan build of the
# test programs and their unit and multi-rank tests; the checkpoint readers' fuzzers; ThreadSanitizer
# when asked. A table of the stages' times ends the output, whether the run passed or not.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
stage_rows=()
print_stage_table() {
  local row total=0
  (( ${#stage_rows[@]} )) || return 0
  echo
  echo "== tools/test.sh: time per stage"
  printf '%-34s %8s  %s\n' stage seconds result
  for row in "${stage_rows[@]}"; do
    IFS='|' read -r name seconds status <<<"$row"
    printf '%-34s %8d  %s\n' "$name" "$seconds" "$([[ $status == 0 ]] && echo ok || echo "FAILED ($status)")"
    total=$((total + seconds))
  done
  printf '%-34s %8d\n' total "$total"
}
trap print_stage_table EXIT
# run_stage NAME COMMAND...: runs the command, records its time and status; fails as it fails.
run_stage() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "== $name"
  "$@" || status=$?
  stage_rows+=("$name|$((SECONDS - start))|$status")
  return "$status"
}

run_stage packages bash tools/install_deps.sh

# fmt header-only, the Python wheel's configuration: the python_wheel test then links this
# build's compiled library into the wheel instead of compiling it again (about 300 s of both
# cores; tests/python/CMakeLists.txt). The default, a shared libfmt, is the sanitizer build's.
release_build() {
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSHARDOPT_FMT_HEADER_ONLY=ON
  cmake --build build -j"$jobs"
}
run_stage "release build" release_build

# Multi-rank tests run as root on CI machines, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
# One `cores` slot per core (at least 2: the Python tests hold two). Each test holds its
# PROCESSORS' worth while it runs, except those labelled `waits` (fault trials, multi-host
# cases: mostly waiting out a timeout or a killed rank's teardown), which run beside them in the
# extra jobs (tests/CMakeLists.txt, shardopt_share_cores).
core_slots=$(( jobs > 2 ? jobs : 2 ))
resource_spec=$PWD/build/ctest_resources.json
printf '{"version": {"major": 1, "minor": 0}, "local": [{"cores": [{"id": "0", "slots": %d}]}]}\n' \
  "$core_slots" >"$resource_spec"
ctest_shared() {
  ctest --output-on-failure --resource-spec-file "$resource_spec" -j"$((core_slots + 4))" "$@"
}

# ---- sanitizers and fuzzing --------------------------------------------------------------------
# A second build with ASan + UBSan (float-cast-overflow included), CUDA off, running the unit and
# multi-rank tests (not python, benches, demos or the install test, so the tools are not built).
# LeakSanitizer runs on the unit tests; under MPI it is off: Open MPI's plugins leak at MPI_Finalize from modules it has
# already unloaded, which LSan reports as "<unknown module>" frames that no suppression can name.
sanitize_unit='-L unit -LE mpi|bench|python'
sanitize_mpi='-L mpi -LE python|bench|demo|install|gpu'
# -g1 (line tables only): ASan and UBSan still name file and line in every frame, and a
# template-heavy file compiles in about 70% of the time -g takes (30.9 s -> 21.6 s measured on
# src/checkpoint/manifest.cpp with ASan). -O1, ASan's own recommendation: it keeps more of the
# checked loads and stores than -O2 and compiles in about 60% of its time (40.9 s -> 25.0 s,
# the same file); the CPU kernels keep their -O3 (their target sets it), so the vectorised
# loops the release build runs are the ones checked. The test code gets UBSan only
# (tests/CMakeLists.txt).
sanitize_build() {
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDOPT_WITH_CUDA=OFF -DSHARDOPT_SANITIZE=ON \
    -DSHARDOPT_BUILD_TOOLS=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  # Only the programs those tests run (the other test programs are the release stage's).
  local targets
  # shellcheck disable=SC2086
  targets=$(python3 tools/ctest_targets.py build-sanitize $sanitize_unit -- $sanitize_mpi)
  # shellcheck disable=SC2086
  cmake --build build-sanitize -j"$jobs" --target $targets
}
# That build and the fuzz harnesses' (clang) compile beside the release tests, at the lowest CPU
# priority: the tests spend much of their time waiting (timeouts, killed ranks' teardown, file
# syncs), and the compilers take the idle cores without slowing a test that wants one.
background_log=$PWD/build/background_builds.log
background_start=$SECONDS
(
  renice -n 19 -p "$BASHPID" >/dev/null  # what this subshell starts inherits it
  sanitize_build && bash tests/fuzz/run.sh build-fuzz --build-only
) >"$background_log" 2>&1 &
background_pid=$!
release_status=0
run_stage "release tests" ctest_shared --test-dir build || release_status=$?
background_status=0
wait "$background_pid" || background_status=$?
stage_rows+=("sanitizer + fuzz builds (beside)|$((SECONDS - background_start))|$background_status")
if (( background_status != 0 )); then
  tail -n 60 "$background_log"
  echo "test.sh: the sanitizer or fuzz build failed (whole log: $background_log)" >&2
fi
(( release_status == 0 && background_status == 0 )) || exit 1

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tools/sanitizer/ubsan.supp"
# shellcheck disable=SC2086
ASAN_OPTIONS=detect_leaks=1 run_stage "sanitizer unit tests" \
  ctest --test-dir build-sanitize --output-on-failure -j"$jobs" $sanitize_unit
# shellcheck disable=SC2086
ASAN_OPTIONS=detect_leaks=0 run_stage "sanitizer multi-rank tests" ctest_shared --test-dir build-sanitize $sanitize_mpi

# The checkpoint readers' fuzz harnesses (clang, libFuzzer): the seed corpus replayed, then a
# bounded fuzzing run per harness; any crash fails.
SHARDOPT_FUZZ_SECONDS=${SHARDOPT_FUZZ_SECONDS:-60} run_stage fuzzers bash tests/fuzz/run.sh build-fuzz

# ThreadSanitizer over the threaded paths (a clang build of the library and three test
# programs; tools/sanitizer/tsan.sh). Opt-in, as it adds a third build to CI's time.
if [[ ${SHARDOPT_TSAN:-0} == 1 ]]; then
  run_stage "thread sanitizer" bash tools/sanitizer/tsan.sh build-tsan
fi
