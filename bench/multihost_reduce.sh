#!/usr/bin/env bash
# bench/multihost_reduce.sh — reduce_gradients() over 2 namespace hosts x 2 ranks: MPI's bucketed all-reduce (node sharing off) against the hierarchical average (node slots, then the carrier groups), run alternately.
#
# Usage (root, network namespaces): bench/multihost_reduce.sh PROBE [PAIRS] [EXTRA_NUMEL]
# The hosts are network namespaces of one machine joined by TCP over veths: this checks that
# the path works and what it costs here, not what a real network would give. Prints one line
# per run (the slowest rank's median reduce_gradients() over the steps after the first) with
# the load average; quote ratios within one sequence.
set -uo pipefail
probe=${1:?usage: multihost_reduce.sh PROBE [PAIRS] [EXTRA_NUMEL]}
pairs=${2:-3}
extra=${3:-4194304}
source "$(dirname "$0")/../tests/multihost/harness.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mh_check_capable || exit "$MH_SKIP_CODE"
mh_setup_hosts 2 || exit 1
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; 2 hosts x 2 ranks over TCP between namespaces; f32, $((extra + 3569)) elements, stage 1, 6 steps"
for (( i = 1; i <= pairs; ++i )); do
  for path in mpi hierarchical; do
    shared=1
    [[ $path == mpi ]] && shared=0
    line=$(mh_mpirun 2,2 "$probe" --steps 6 --inexact 1 --extra-numel "$extra" --node-shared "$shared" 2>&1 | grep -E '^hosts=')
    echo "run $i path=$path reduce_ms=$(grep -oE 'reduce_ms=[0-9.]+' <<<"$line" | cut -d= -f2) grad_slots=$(grep -oE 'grad_slots=[0-9,]+' <<<"$line" | cut -d= -f2) params_fnv=$(grep -oE 'params_fnv=[0-9a-f]+' <<<"$line" | cut -d= -f2) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
