#!/usr/bin/env bash
# tests/demo/demo_resume_test.sh — 4 steps straight == 2 steps, --save, --resume, 2 more; a 2-rank checkpoint also resumes at 1 and 3 ranks.
set -euo pipefail
demo=$1 mpiexec=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
args=(--layers 3 --width 48 --batch 4)

sums() {  # prints "sharded_sum replicated_sum" from a demo run's output
  grep -o 'mode=[a-z]* .*params_sum=[-+.e0-9]*' | sed 's/mode=\([a-z]*\).*params_sum=\(.*\)/\1=\2/' | sort | tr '\n' ' '
}
run() {  # run NP ARGS...
  local np=$1
  shift
  "$mpiexec" -n "$np" --oversubscribe --allow-run-as-root "$demo" "${args[@]}" "$@"
}

straight=$(run 2 --steps 4 | sums)
run 2 --steps 2 --save "$work/ckpt" > /dev/null
resumed=$(run 2 --steps 2 --resume "$work/ckpt" | sums)
if [[ "$resumed" != "$straight" ]]; then
  echo "FAIL: resumed: $resumed; straight: $straight" >&2
  exit 1
fi
echo "resumed at np=2 matches: $resumed"
# Other world sizes average other batches, so their sums differ; they must load and agree.
for np in 1 3; do
  run "$np" --steps 1 --resume "$work/ckpt" | grep -x 'params_sum_match=yes' > /dev/null
  echo "resumed at np=$np"
done
echo "1 passed, 0 failed"
