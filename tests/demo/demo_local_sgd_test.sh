#!/usr/bin/env bash
# tests/demo/demo_local_sgd_test.sh — shardopt-demo --local-sgd at 4 ranks: the bytes it prints are what the arithmetic gives, and hierarchical/outer/replica runs complete with finite losses.
set -euo pipefail
demo=$1 mpiexec=$2
np=4 steps=22 period=4 warmup=2
# 3 Linear(64, 64): 12480 params, a multiple of 16 * 4, so no partition pads the flat buffers and
# every collective below carries exactly the model.
args=(--layers 3 --width 64 --batch 5 --steps "$steps")

run() {  # run ARGS...: the demo at $np ranks, its output on stdout (and in the log on failure)
  local out
  if ! out=$("$mpiexec" -n "$np" --oversubscribe --allow-run-as-root "$demo" "${args[@]}" "$@" 2>&1); then
    echo "FAIL: shardopt-demo ${args[*]} $* exited with an error:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "$out"
}
field() {  # field LINE_PREFIX NAME < output: the value of NAME= on the line starting with LINE_PREFIX
  { grep "^$1" | grep -o " $2=[^ ]*" | head -n 1 | cut -d= -f2; } || true
}
fail() {
  echo "FAIL: $*" >&2
  echo "$out" >&2
  exit 1
}

# ---- periodic averaging, every rank its own replica --------------------------------------------
out=$(run --local-sgd "period=$period,warmup=$warmup")
echo "$out"
grep -qx 'params_sum_match=yes' <<<"$out" || fail "the usual modes no longer match"
params=$(field 'mode=sharded' params <<<"$out")
[[ $params == 12480 ]] || fail "params=$params, expected 12480"
bytes_per_model=$((4 * params))  # f32
# Synchronous: every step all-reduces the gradients (one model's worth) and syncs the parameters
# (this rank broadcasts its shard, 1/np of the model): with --local-sgd the demo keeps node-shared
# memory off, so both cross the communicator as they would between nodes.
expected_sync=$((steps * (bytes_per_model + bytes_per_model / np)))
# Local SGD: the warmup steps average gradients over the world (one model each); then every
# step with (step - warmup) % period == 0 averages the parameters (torch's
# PeriodicModelAverager, counting from the end of the warmup: steps 2, 6, ..., 18 of 0..21), each
# rank sending its whole model (its replica is itself); the one-rank replicas add nothing.
averages=0
for ((s = warmup; s < steps; ++s)); do
  if (((s - warmup) % period == 0)); then averages=$((averages + 1)); fi
done
expected_gradient=$((warmup * bytes_per_model))
expected_averaging=$((averages * bytes_per_model))
expected_local=$((expected_gradient + expected_averaging))
check() {  # check NAME GOT EXPECTED
  [[ $2 == "$3" ]] || fail "$1=$2, expected $3"
}
check "sync bytes" "$(field 'sync:' bytes <<<"$out")" "$expected_sync"
check "sync mode" "$(field 'sync:' mode <<<"$out")" sharded
check averages "$(field 'local_sgd:' averages <<<"$out")" "$averages"
check gradient_bytes "$(field 'local_sgd:' gradient_bytes <<<"$out")" "$expected_gradient"
check averaging_bytes "$(field 'local_sgd:' averaging_bytes <<<"$out")" "$expected_averaging"
check replica_bytes "$(field 'local_sgd:' replica_bytes <<<"$out")" 0
check "local_sgd bytes" "$(field 'local_sgd:' bytes <<<"$out")" "$expected_local"
# The ratio of bytes per step: 1.25 steps / (warmup + averages) = 27.5 / 7, near the period.
ratio=$(grep -o '^bytes_ratio=[0-9.]*' <<<"$out" | cut -d= -f2)
awk -v got="$ratio" -v s="$expected_sync" -v l="$expected_local" 'BEGIN {
  want = s / l
  if (!(got + 0 > 2.5 && got + 0 < 4.5) || (got - want) > 1e-5 || (want - got) > 1e-5) {
    printf "FAIL: bytes_ratio=%s, expected %.6f\n", got, want > "/dev/stderr"
    exit 1
  }
}' || fail "bytes_ratio"
echo "periodic: bytes and ratio as computed ($ratio)"

# ---- hierarchical averaging with an outer optimizer; replicas of 2 ranks -----------------------
finite_losses() {  # finite_losses: both final_loss= values are plain finite numbers
  local sync local_sgd
  sync=$(field 'sync:' final_loss <<<"$out")
  local_sgd=$(field 'local_sgd:' final_loss <<<"$out")
  for v in "$sync" "$local_sgd"; do
    [[ $v =~ ^[0-9]\.[0-9]+e[-+][0-9]+$ ]] || fail "final_loss '$v' is not a finite number"
  done
  echo "final_loss sync=$sync local_sgd=$local_sgd"
}
for spec in "period=4,warmup=2,hier=2:2:4:4,outer=0.7:0.9" "period=2,warmup=1,replica=2,outer=0.7:0.9"; do
  out=$(run --mode sharded --local-sgd "$spec")
  echo "$out"
  grep -q "^local_sgd: spec=$spec " <<<"$out" || fail "no local_sgd line for $spec"
  finite_losses
done
echo "1 passed, 0 failed"
