#!/usr/bin/env bash
# tests/fuzz/run.sh — builds the checkpoint readers' libFuzzer harnesses with clang, replays the seed corpus, then fuzzes each harness for a bounded time; fails on any crash.
#
#   bash tests/fuzz/run.sh [BUILD_DIR]     SHARDOPT_FUZZ_SECONDS (default 60) per harness
# Inputs the fuzzer finds go to a temporary directory, not into the checked-in corpus; a crash
# leaves its input (crash-*) in BUILD_DIR/artifacts and makes the script fail.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build-fuzz}
seconds=${SHARDOPT_FUZZ_SECONDS:-60}
CC=clang CXX=clang++ cmake -S tests/fuzz -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/artifacts"
for harness in manifest safetensors checkpoint_dir; do
  seeds=tests/fuzz/corpus/$harness
  echo "fuzz_$harness: replaying $(ls "$seeds" | wc -l) seeds"
  "$build/fuzz_$harness" -runs=0 -artifact_prefix="$build/artifacts/" "$seeds" 2>"$work/replay.log" ||
    { tail -n 40 "$work/replay.log"; exit 1; }
  echo "fuzz_$harness: fuzzing for ${seconds}s"
  mkdir -p "$work/$harness"
  "$build/fuzz_$harness" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$build/artifacts/" "$work/$harness" "$seeds" 2>"$work/fuzz.log" ||
    { tail -n 40 "$work/fuzz.log"; exit 1; }
  grep -E '^Done [0-9]+ runs' "$work/fuzz.log" || true
done
