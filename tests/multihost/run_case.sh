#!/usr/bin/env bash
# tests/multihost/run_case.sh — one multi-host test case (see README.md): builds the hosts, runs Open MPI across them, checks what the ranks report, removes everything.
#
# Usage: run_case.sh CASE PROBE [DEMO]
#   PROBE: the multihost_probe binary; DEMO: shardopt-demo (demo_2x2 only).
# Exits 0 (pass), 1 (fail) or 77 (skipped: no root or no namespaces here; one line says why).
set -uo pipefail

case_name=${1:?usage: run_case.sh CASE PROBE [DEMO]}
probe=${2:?usage: run_case.sh CASE PROBE [DEMO]}
demo=${3:-}
source "$(dirname "$0")/harness.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mh_check_capable || exit "$MH_SKIP_CODE"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# expect TEXT REGEX WHAT: TEXT must match the (extended) regular expression.
expect() {
  if [[ $1 =~ $2 ]]; then echo "ok: $3"; else fail "$3: no match for '$2'"; fi
}

# run SLOTS LOG PROGRAM ARGS...: mh_mpirun with the output in LOG (and echoed); prints the time.
run() {
  local slots=$1 log=$2 start status=0
  shift 2
  start=$(date +%s.%N)
  mh_mpirun "$slots" "$@" >"$log" 2>&1 || status=$?
  cat "$log"
  echo "multihost: $case_name: mpirun over slots $slots took $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }') s, status $status"
  return "$status"
}

summary_of() { grep -E '^hosts=' "$1"; }
node_ranks_of() { grep -oE '^hosts=.* node_ranks=[0-9,]+' "$1" | grep -oE '[0-9,]+$'; }
fnv_of() { grep -oE '^hosts=.* params_fnv=[0-9a-f]+' "$1" | grep -oE '[0-9a-f]+$'; }

# SLOTS on the hosts, then all those ranks on one host: the groups are what the placement
# says and the parameters bitwise the same as on one host (and as one host cut into nodes of
# RANKS_PER_NODE by CommOptions.ranks_per_node, when given).
check_placement() {
  local slots=$1 want_summary=$2 ranks_per_node=${3:-} np=0 n
  for n in ${slots//,/ }; do (( np += n )); done
  run "$slots" "$MH_WORK/multi.log" "$probe" || fail "probe over $slots exited non-zero"
  expect "$(summary_of "$MH_WORK/multi.log")" "^${want_summary} " "placement $slots"
  run "$np" "$MH_WORK/single.log" "$probe" || fail "probe on one host exited non-zero"
  expect "$(summary_of "$MH_WORK/single.log")" "^hosts=1 node_sizes=" "one host, $np ranks"
  local multi single
  multi=$(fnv_of "$MH_WORK/multi.log")
  single=$(fnv_of "$MH_WORK/single.log")
  [[ -n $multi && $multi == "$single" ]] && echo "ok: parameters over $slots equal one host's ($multi)" ||
    fail "parameters over $slots ($multi) differ from one host's ($single)"
  if [[ -n $ranks_per_node ]]; then
    run "$np" "$MH_WORK/split.log" "$probe" --ranks-per-node "$ranks_per_node" || fail "probe with ranks_per_node failed"
    [[ $(fnv_of "$MH_WORK/split.log") == "$multi" ]] && echo "ok: equal with ranks_per_node=$ranks_per_node" ||
      fail "parameters with ranks_per_node=$ranks_per_node differ"
    # shardopt's nodes there are those the hosts make here.
    [[ $(node_ranks_of "$MH_WORK/split.log") == "$(node_ranks_of "$MH_WORK/multi.log")" ]] &&
      echo "ok: the same shardopt nodes as ranks_per_node=$ranks_per_node" || fail "shardopt nodes differ from ranks_per_node=$ranks_per_node's"
  fi
}

# Open MPI's own choice of transport: vader (shared memory) within a host only, TCP between
# hosts; with vader alone the hosts cannot reach each other at all.
check_transports() {
  MH_MPIRUN_OPTIONS=(--mca btl_base_verbose 30)
  run 2,2 "$MH_WORK/verbose.log" "$probe" --steps 1 >/dev/null || fail "verbose run exited non-zero"
  MH_MPIRUN_OPTIONS=()
  local line mine peer_node btl wrong=0 vader=0 tcp=0
  # "[host:pid] mca: bml: Using vader btl for send to [[job,1],rank] on node host"
  while read -r line; do
    mine=${line#[}
    mine=${mine%%:*}
    btl=$(sed -E 's/.*Using ([a-z]+) btl.*/\1/' <<<"$line")
    peer_node=${line##* }
    case $btl in
      vader) (( ++vader )); [[ $peer_node == "$mine" ]] || (( ++wrong )) ;;
      tcp) (( ++tcp )); [[ $peer_node != "$mine" ]] || (( ++wrong )) ;;
    esac
  done < <(grep -E 'bml: Using (vader|tcp) btl' "$MH_WORK/verbose.log")
  (( vader == 4 && tcp == 8 && wrong == 0 )) && echo "ok: vader within hosts ($vader), tcp between them ($tcp)" ||
    fail "transports: vader $vader (want 4), tcp $tcp (want 8), $wrong across the wrong boundary"
  # MPI alone: shardopt's MPI_Comm_dup in mpi_world() would wait for the unreachable peers.
  MH_BTL=vader,self MH_TIMEOUT=60 mh_mpirun 2,2 "$probe" --mpi-only 1 >"$MH_WORK/vader.log" 2>&1 &&
    fail "vader alone connected ranks of different hosts"
  grep -q "unable to reach each other" "$MH_WORK/vader.log" && echo "ok: vader alone cannot join two hosts" ||
    fail "vader-only run did not fail as unreachable: $(tail -3 "$MH_WORK/vader.log")"
}

case $case_name in
  placement_2x2)
    mh_setup_hosts 2 || exit 1
    check_placement 2,2 "hosts=2 node_sizes=2,2,2,2 node_ranks=2,2,2,2 shared_param_bytes=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*" 2
    check_transports
    ;;
  placement_3x1)
    mh_setup_hosts 3 || exit 1
    check_placement 1,1,1 "hosts=3 node_sizes=1,1,1 node_ranks=1,1,1 shared_param_bytes=0,0,0" 1
    ;;
  placement_uneven)
    mh_setup_hosts 2 || exit 1
    # Nodes of unequal size: sharing is on for all (the lone rank maps a buffer of its own).
    check_placement 3,1 "hosts=2 node_sizes=3,3,3,1 node_ranks=3,3,3,1 shared_param_bytes=[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*" 3
    ;;
  demo_2x2)
    [[ -n $demo ]] || { echo "demo_2x2 needs the shardopt-demo binary"; exit 1; }
    mh_setup_hosts 2 || exit 1
    demo_args=(--layers 3 --width 64 --batch 5 --steps 4)
    run 2,2 "$MH_WORK/multi.log" "$demo" "${demo_args[@]}" || fail "demo over 2 hosts exited non-zero"
    run 4 "$MH_WORK/single.log" "$demo" "${demo_args[@]}" || fail "demo on one host exited non-zero"
    # The result lines without their timings and memory: params_sum must agree to the bit.
    results() { grep -oE 'mode=[a-z]+ world=4 .*|params_sum_match=[a-z]+' "$1" | sed -E 's/ (peak_rss_mb|step_ms_median)=[0-9.]+//g'; }
    expect "$(results "$MH_WORK/multi.log")" "params_sum_match=yes" "demo over 2 hosts: sharded equals replicated"
    [[ -n $(results "$MH_WORK/multi.log") && $(results "$MH_WORK/multi.log") == "$(results "$MH_WORK/single.log")" ]] &&
      echo "ok: demo results over 2 hosts equal one host's" || fail "demo results differ between 2 hosts and one host"
    ;;
  reduce_2x2)
    # The hierarchical gradient average (each host's slots, then the hosts' sums all-reduced in
    # the carrier groups): with gradients whose sums round, 2 hosts x 2 ranks end with the bits
    # of 4 ranks on one host (the slots there), of one rank handed the average in the slots'
    # tree order, and (stage 1) of MPI's all-reduce across the hosts without node sharing.
    mh_setup_hosts 2 || exit 1
    slots_of() { grep -oE '^hosts=.* grad_slots=[0-9,]+' "$1" | grep -oE '[0-9,]+$'; }
    for stage in 1 2; do
      args=(--steps 4 --inexact 1 --stage "$stage")
      run 2,2 "$MH_WORK/hier$stage.log" "$probe" "${args[@]}" || fail "stage $stage over 2,2 exited non-zero"
      [[ $(slots_of "$MH_WORK/hier$stage.log") == 1,1,1,1 ]] && echo "ok: stage $stage over 2,2 reduces through the hosts' slots" ||
        fail "stage $stage over 2,2: gradient slots $(slots_of "$MH_WORK/hier$stage.log"), want 1,1,1,1"
      run 4 "$MH_WORK/one$stage.log" "$probe" "${args[@]}" || fail "stage $stage on one host exited non-zero"
      # World 1 hands its gradients over at stage 2 too (no grad views at one rank).
      run 1 "$MH_WORK/world1_$stage.log" "$probe" "${args[@]}" --as-ranks 4 || fail "stage $stage at world 1 exited non-zero"
      hier=$(fnv_of "$MH_WORK/hier$stage.log")
      for other in one world1_; do
        [[ -n $hier && $hier == "$(fnv_of "$MH_WORK/$other$stage.log")" ]] &&
          echo "ok: stage $stage over 2,2 bitwise equal to ${other%_}'s ($hier)" ||
          fail "stage $stage over 2,2 ($hier) differs from ${other%_}'s ($(fnv_of "$MH_WORK/$other$stage.log"))"
      done
      if [[ $stage == 1 ]]; then
        # The control: the same gradients summed in another order give other bits, so the
        # equalities above say something about the order.
        run 1 "$MH_WORK/in_order.log" "$probe" "${args[@]}" --as-ranks 4 --in-order 1 || fail "world 1 in order exited non-zero"
        [[ -n $(fnv_of "$MH_WORK/in_order.log") && $(fnv_of "$MH_WORK/in_order.log") != "$hier" ]] &&
          echo "ok: another summation order gives other bits ($(fnv_of "$MH_WORK/in_order.log"))" ||
          fail "summing rank after rank gave the same bits: the gradients do not show the order"
        run 2,2 "$MH_WORK/mpi$stage.log" "$probe" "${args[@]}" --node-shared 0 || fail "MPI path over 2,2 exited non-zero"
        [[ $(slots_of "$MH_WORK/mpi$stage.log") == 0,0,0,0 ]] || fail "node sharing off still used slots"
        [[ $hier == "$(fnv_of "$MH_WORK/mpi$stage.log")" ]] && echo "ok: stage 1 equal to MPI's all-reduce across hosts" ||
          fail "stage 1 over 2,2 ($hier) differs from MPI's all-reduce ($(fnv_of "$MH_WORK/mpi$stage.log"))"
      fi
    done
    ;;
  link_cut)
    mh_setup_hosts 2 || exit 1
    h0=${MH_HOSTS[0]}
    h1=${MH_HOSTS[1]}
    mh_reachable "$h0" 198.18.0.11 && echo "ok: $h0 reaches $h1" || fail "$h0 cannot reach $h1 before the cut"
    mh_cut_link "$h1"
    mh_reachable "$h0" 198.18.0.11 && fail "$h0 still reaches $h1 after the cut" || echo "ok: the cut isolates $h1"
    mh_reachable "$h1" 198.18.0.2 && fail "$h1 still reaches the launcher after the cut" || echo "ok: $h1 cannot reach out"
    mh_restore_link "$h1"
    mh_reachable "$h0" 198.18.0.11 && echo "ok: restored" || fail "$h0 cannot reach $h1 after the restore"
    ;;
  netem)
    mh_setup_hosts 2 || exit 1
    # netem where the kernel has it; otherwise a rate limit with random loss (tbf + nftables).
    if why=$(mh_netem_available); then
      degrade() { mh_netem "${MH_HOSTS[1]}" delay 5ms loss 1%; }
      dropped() { echo "netem's"; }
    elif why_not=$(mh_degrade_available); then
      echo "multihost: $why; a rate limit (tbf, 20mbit) and 2% TCP loss (nftables) instead"
      degrade() { mh_degrade "${MH_HOSTS[1]}" 20mbit 20; }
      dropped() { mh_degrade_dropped "${MH_HOSTS[1]}"; }
    else
      echo "multihost: skipped: $why; $why_not"
      exit "$MH_SKIP_CODE"
    fi
    run 2,2 "$MH_WORK/clean.log" "$probe" --steps 20 || fail "clean run exited non-zero"
    degrade || fail "could not degrade the link"
    run 2,2 "$MH_WORK/netem.log" "$probe" --steps 20 || fail "run on the degraded link exited non-zero"
    [[ -n $(fnv_of "$MH_WORK/clean.log") && $(fnv_of "$MH_WORK/clean.log") == "$(fnv_of "$MH_WORK/netem.log")" ]] &&
      echo "ok: the same parameters under delay and loss" || fail "the degraded link changed the result"
    lost=$(dropped)
    [[ $lost != 0 ]] && echo "ok: $lost TCP packets were dropped during the run" ||
      fail "no packet was dropped: the run did not see a lossy link"
    ;;
  kill_rank)
    mh_setup_hosts 2 || exit 1
    # From outside: rank 3 (on host 1) is SIGKILLed once it reaches step 2; Open MPI ends the job.
    MH_TIMEOUT=60
    mh_kill_when_marked step2 3
    run 2,2 "$MH_WORK/outside.log" "$probe" --steps 50 --pause-ms 100 --timeout 10 &&
      fail "the job succeeded although rank 3 was killed"
    pid=$(cat "$SHARDOPT_TEST_MARK_DIR/step2.rank3" 2>/dev/null)
    [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null && echo "ok: rank 3 (pid $pid) was killed at step2" ||
      fail "rank 3 was not killed at its mark"
    [[ ! -e $SHARDOPT_TEST_MARK_DIR/done.rank0 ]] && echo "ok: the job did not reach its end" || fail "rank 0 finished"
    # From inside: rank 1 kills itself exactly at step 1.
    mh_clear_marks
    SHARDOPT_TEST_KILL_AT=step1:1 run 2,2 "$MH_WORK/inside.log" "$probe" --steps 50 --timeout 10 &&
      fail "the job succeeded although rank 1 killed itself"
    [[ -e $SHARDOPT_TEST_MARK_DIR/step1.rank1 && ! -e $SHARDOPT_TEST_MARK_DIR/step2.rank1 ]] &&
      echo "ok: rank 1 stopped at step1" || fail "rank 1 did not stop at step1"
    ;;
  survive_kill | survive_link_cut)
    # The survivors' side of a fault across hosts: rank 3 (host 1) SIGKILLed at step 2, or
    # host 1's link cut when rank 2 reaches step 3. Every rank that still runs ends with an
    # Error naming the optimizer call within the timeout, and no rank outlives the teardown
    # (the watched exit barrier ends each process without waiting on the lost peers). Open
    # MPI's launcher and daemons themselves do not end after such a fault (with
    # --enable-recovery, or cut off from a host): they are stopped at MH_TIMEOUT, by which time
    # every rank must be gone.
    mh_setup_hosts 2 || exit 1
    timeout_s=4
    MH_TIMEOUT=25
    if [[ $case_name == survive_kill ]]; then
      # Without --enable-recovery the launcher kills every rank as soon as one dies, and the
      # survivors' own handling would never be seen.
      MH_MPIRUN_OPTIONS+=(--enable-recovery)
      mh_kill_when_marked step2 3
      survivors=(0 1 2)
    else
      mh_cut_link_when_marked "${MH_HOSTS[1]}" step3 2
      survivors=(0 1 2 3)
    fi
    run 2,2 "$MH_WORK/fault.log" "$probe" --steps 40 --pause-ms 100 --timeout "$timeout_s" &&
      fail "the job succeeded despite the fault"
    for r in 0 1 2 3; do
      pid=$(cat "$SHARDOPT_TEST_MARK_DIR/init.rank$r" 2>/dev/null)
      [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid") != Z* ]] &&
        fail "rank $r (pid $pid) still ran ${MH_TIMEOUT} s after the start"
    done
    echo "ok: no rank outlived the ${MH_TIMEOUT} s bound"
    [[ $case_name == survive_link_cut ]] && mh_restore_link "${MH_HOSTS[1]}"
    for r in "${survivors[@]}"; do
      line=$(mh_rank_output "$r" | grep -E "^rank $r: " | head -1)
      expect "$line" "^rank $r: (reduce_gradients|step): .*(did not complete within $timeout_s s|failed in MPI)" \
        "rank $r named the interrupted call: ${line:0:200}"
    done
    # The launcher's daemons that lost their peers are the harness's to stop, not a rank.
    for ns in "${MH_HOSTS[@]}"; do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sleep 0.5
    ;;
  survive_stall_reduce)
    # A rank stalled inside the hierarchical average: rank 3 (host 1) is stopped (SIGSTOP) as
    # it enters step 3's reduce_gradients() with a model large enough (16M f32) that the stop
    # lands in the node barriers or the cross-host all-reduce. Every other rank ends with an
    # Error naming reduce_gradients and the timeout.
    mh_setup_hosts 2 || exit 1
    timeout_s=4
    MH_TIMEOUT=40
    mh_kill_when_marked reduce3 3 STOP
    run 2,2 "$MH_WORK/stall.log" "$probe" --steps 6 --extra-numel 16777216 --timeout "$timeout_s" &&
      fail "the job succeeded despite the stalled rank"
    for r in 0 1 2; do
      line=$(mh_rank_output "$r" | grep -E "^rank $r: " | head -1)
      expect "$line" "^rank $r: reduce_gradients: .*did not complete within $timeout_s s" \
        "rank $r named the stalled reduction: ${line:0:200}"
    done
    for ns in "${MH_HOSTS[@]}"; do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sleep 0.5
    ;;
  *)
    echo "run_case.sh: unknown case '$case_name'"
    exit 2
    ;;
esac

# Nothing may outlive the case: no process in the hosts once mpirun has returned.
for ns in "${MH_HOSTS[@]}" "$MH_LAUNCH_NS"; do
  left=$(ip netns pids "$ns" 2>/dev/null | wc -l)
  (( left == 0 )) || fail "$left processes still run in $ns after mpirun returned"
done
if (( failures > 0 )); then
  echo "$case_name: $failures check(s) failed"
  exit 1
fi
echo "$case_name: passed"
