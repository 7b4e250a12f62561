#!/usr/bin/env bash
# tests/remote/remote_fault_case.sh — one remote-optimizer fault trial: passes when every survivor printed an ok FAULT-RESULT in bounded time and no rank outlived the job.
#
#   remote_fault_case.sh NP SCENARIO ORDER FAULT_RUN [MPIEXEC]
#
# mpirun runs with --enable-recovery: without it Open MPI's launcher kills every rank as soon
# as one dies, and the survivors' own handling (the subject here) would never be seen.
set -uo pipefail
np=$1 scenario=$2 order=$3 fault_run=$4 mpiexec=${5:-mpirun}
job_limit=40
log=$(mktemp "${TMPDIR:-/tmp}/shardopt-remote-fault.XXXXXX")
trap 'rm -f "$log"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--enable-recovery --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

fail() { echo "FAIL np=$np scenario=$scenario order=$order: $*"; echo "--- job output"; cat "$log"; exit 1; }

timeout -k 5 "$job_limit" "$mpiexec" "${mpi_flags[@]}" -n "$np" "$fault_run" "$scenario" "$order" >"$log" 2>&1
status=$?
[[ $status -eq 124 || $status -eq 137 ]] && fail "the job did not end within ${job_limit} s (a survivor hung)"
grep -q "MPI_ABORT\|MPI_ERRORS_ARE_FATAL" "$log" && fail "the job was aborted"
results=$(grep -c "^FAULT-RESULT" "$log")
[[ $results -eq $((np - 1)) ]] || fail "$results of $((np - 1)) survivors reported"
grep "^FAULT-RESULT" "$log" | grep -v " ok=1 " && fail "a survivor's result was wrong, unnamed or late"
pgrep -f -- "$fault_run $scenario $order" >/dev/null && fail "a rank outlived the job"
echo "PASS np=$np scenario=$scenario order=$order: $((np - 1)) survivors"
grep "^FAULT-RESULT" "$log" | sed 's/^/  /'
