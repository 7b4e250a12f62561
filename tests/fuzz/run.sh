#!/usr/bin/env bash
# tests/fuzz/run.sh — builds the checkpoint readers' libFuzzer harnesses with clang, replays the seed corpus, then fuzzes each harness for a bounded time; fails on any crash.
#
#   bash tests/fuzz/run.sh [BUILD_DIR [--build-only]]     SHARDOPT_FUZZ_SECONDS (default 60) per harness
# Inputs the fuzzer finds go to a temporary directory, not into the checked-in corpus; a crash
# leaves its input (crash-*) in BUILD_DIR/artifacts and makes the script fail.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${1:-build-fuzz}
seconds=${SHARDOPT_FUZZ_SECONDS:-60}
CC=clang CXX=clang++ cmake -S tests/fuzz -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"
[[ ${2:-} == --build-only ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build/artifacts"
# fuzz_one HARNESS: the seeds replayed, then fuzzing for the bounded time; its log in $work.
fuzz_one() {
  local harness=$1 seeds=tests/fuzz/corpus/$1 log=$work/$1.log
  echo "fuzz_$harness: replaying $(ls "$seeds" | wc -l) seeds, then fuzzing for ${seconds}s" >"$log"
  "$build/fuzz_$harness" -runs=0 -artifact_prefix="$build/artifacts/" "$seeds" >>"$log" 2>&1 || return 1
  mkdir -p "$work/$harness"
  "$build/fuzz_$harness" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$build/artifacts/" "$work/$harness" "$seeds" >>"$log" 2>&1
}
# The harnesses run side by side, one per core (each fuzzes single-threaded for its own time).
harnesses=(manifest safetensors checkpoint_dir)
declare -A job_of=()
failed=0
finish() {  # waits for harness $1 and prints its verdict
  local harness=$1 log=$work/$1.log
  if wait "${job_of[$harness]}"; then
    head -n 1 "$log"
    grep -E '^Done [0-9]+ runs' "$log" | sed "s/^/fuzz_$harness: /" || true
  else
    echo "fuzz_$harness: FAILED"
    tail -n 40 "$log"
    failed=1
  fi
}
running=()
for harness in "${harnesses[@]}"; do
  if (( ${#running[@]} >= $(nproc) )); then
    finish "${running[0]}"
    running=("${running[@]:1}")
  fi
  fuzz_one "$harness" &
  job_of[$harness]=$!
  running+=("$harness")
done
for harness in "${running[@]}"; do
  finish "$harness"
done
exit "$failed"
