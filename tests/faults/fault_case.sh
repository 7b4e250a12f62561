#!/usr/bin/env bash
# tests/faults/fault_case.sh — one fault trial: NP ranks, rank VICTIM SIGKILLed inside POINT; passes when every survivor named the failure in bounded time, no process outlived the job, and the previous checkpoint verifies and resumes bitwise.
#
#   fault_case.sh NP POINT VICTIM FAULT_RUN SHARDOPT_CKPT [MPIEXEC]
#
# A kill that lands after rank 0 committed a save at POINT leaves that save as the checkpoint:
# it must then be complete and resume bitwise instead (fault_run verify says which it loaded).
#
# mpirun runs with --enable-recovery: without it Open MPI's launcher kills every rank as soon
# as one dies, and the survivors' own handling (the subject here) would never be seen.
set -uo pipefail
np=$1 point=$2 victim=$3 fault_run=$4 ckpt_tool=$5 mpiexec=${6:-mpirun}
timeout_s=3
# The survivors' error comes within the timeout plus the call's own work; teardown after it is
# bounded by this outer limit, so a survivor that lingers fails the case instead of hanging CI.
job_limit=40

dir=$(mktemp -d "${TMPDIR:-/tmp}/shardopt-fault.XXXXXX")
trap 'rm -rf "$dir"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi_flags=(--enable-recovery --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

fail() { echo "FAIL np=$np point=$point victim=$victim: $*"; echo "--- job output"; cat "$dir/run.log"; exit 1; }

start=$(date +%s.%N)
timeout -k 5 "$job_limit" "$mpiexec" "${mpi_flags[@]}" -n "$np" "$fault_run" run --dir "$dir" --point "$point" \
  --victim "$victim" --timeout "$timeout_s" >"$dir/run.log" 2>&1
status=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
[[ $status -eq 124 || $status -eq 137 ]] && fail "the job did not end within ${job_limit} s (a survivor hung)"
grep -q "MPI_ABORT\|MPI_ERRORS_ARE_FATAL" "$dir/run.log" && fail "the job was aborted"

results=$(grep -c "^FAULT-RESULT" "$dir/run.log")
[[ $results -eq $((np - 1)) ]] || fail "$results of $((np - 1)) survivors reported"
grep "^FAULT-RESULT" "$dir/run.log" | grep -v " ok=1 " && fail "a survivor's error was missing, unnamed or late"
# No rank of this job is left running once the launcher returned.
pgrep -f -- "$fault_run run --dir $dir" >/dev/null && fail "a rank outlived the job"

"$ckpt_tool" verify "$dir/ckpt" >"$dir/verify.log" 2>&1 || { cat "$dir/verify.log"; fail "the checkpoint does not verify"; }
timeout -k 5 "$job_limit" "$mpiexec" "${mpi_flags[@]}" -n "$np" "$fault_run" verify --dir "$dir" >"$dir/resume.log" 2>&1
grep -q "^VERIFY ok=1" "$dir/resume.log" || { cat "$dir/resume.log"; fail "the checkpoint did not resume bitwise"; }

inside=$(grep -c "outlived the call" "$dir/run.log")
worst=$(grep "^FAULT-RESULT" "$dir/run.log" | sed 's/.*seconds=\([0-9.]*\).*/\1/' | sort -n | tail -1)
echo "PASS np=$np point=$point victim=$victim: $((np - 1)) survivors named the failure (slowest after ${worst} s," \
     "job ended after ${elapsed%.*} s, kill $([[ $inside -eq 0 ]] && echo inside || echo after) the call);" \
     "verified and resumed bitwise: $(sed -n 's/^VERIFY ok=1 //p' "$dir/resume.log")"
grep "^FAULT-RESULT" "$dir/run.log" | head -1 | sed 's/^/  e.g. /'
