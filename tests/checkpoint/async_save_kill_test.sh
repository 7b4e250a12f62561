#!/usr/bin/env bash
# tests/checkpoint/async_save_kill_test.sh — every rank SIGKILLed at each point of a background save: the previous checkpoint verifies, its manifest is the same bytes, and it resumes bitwise.
#
#   async_save_kill_test.sh PROGRAM CKPT_TOOL MPIEXEC SCRATCH
set -u
program=$1 tool=$2 mpiexec=$3 scratch=$4
np=2
fail() { echo "FAIL ($point): $*"; exit 1; }
for point in half-written sources-read committed; do
  dir=$scratch/$point
  rm -rf "$scratch/$point"*
  mkdir -p "$scratch"
  SHARDOPT_TEST_PAUSE_ASYNC_SAVE="$point:$dir.paused" \
    "$mpiexec" -n $np --oversubscribe --allow-run-as-root "$program" train "$dir" > "$dir.log" 2>&1 &
  job=$!
  # Every rank's writer reports its process id once it is held at the point.
  for _ in $(seq 600); do
    ready=1
    for r in $(seq 0 $((np - 1))); do [ -s "$dir.paused.$r" ] || ready=0; done
    [ $ready = 1 ] && break
    kill -0 $job 2>/dev/null || { cat "$dir.log"; fail "the run ended before the writers paused"; }
    sleep 0.1
  done
  [ $ready = 1 ] || fail "the writers did not pause within a minute"
  cp "$dir/manifest.json" "$dir.manifest-before"
  for r in $(seq 0 $((np - 1))); do kill -KILL "$(cat "$dir.paused.$r")"; done
  wait $job 2>/dev/null
  cmp -s "$dir/manifest.json" "$dir.manifest-before" || fail "manifest.json changed"
  case $point in
    half-written|sources-read) ls -a "$dir" | grep -q '^\.shard-.*\.tmp$' || fail "no partial temporary file was left: the kill came too late";;
    committed) [ "$(ls "$dir" | grep -c '^shard-')" -gt $np ] || fail "the new shard files were not in place";;
  esac
  "$tool" verify "$dir" > "$dir.verify" 2>&1 || { cat "$dir.verify"; fail "the previous checkpoint does not verify"; }
  out=$("$mpiexec" -n $np --oversubscribe --allow-run-as-root "$program" check "$dir" 2>&1)
  echo "$out" | grep -q "resumed bitwise" || { echo "$out"; fail "the previous checkpoint did not resume bitwise"; }
  echo "killed at $point: previous checkpoint intact, verifies and resumes bitwise"
done
echo "async save kill test passed"
