# tests/multihost/harness.sh — hosts made of network namespaces on one machine, Open MPI run across them, and the faults a test injects into them (link cut, netem, SIGKILL); source it from bash.
#
#   source tests/multihost/harness.sh
#   mh_check_capable || exit "$MH_SKIP_CODE"   # prints one line saying why not
#   mh_setup_hosts 2                            # hosts ${MH_HOSTS[0]}, ${MH_HOSTS[1]}
#   mh_mpirun 2,2 ./program args                # ranks 0-1 on host 0, ranks 2-3 on host 1
#
# What it makes, all named ${MH_ID}-... (MH_ID = somh<PID of this shell>):
#  - ${MH_ID}-net: a namespace holding only the bridge br0; host i's veth ends in it as port p<i>.
#  - ${MH_ID}-h<i>: host i, eth0 198.18.0.<10+i>/24 and lo; its hostname is the namespace's name.
#  - ${MH_ID}-launch: eth0 198.18.0.2/24, where mpirun runs (as a login node would).
#  - /etc/netns/<namespace>/hosts: the names of all of them, which `ip netns exec` mounts as
#    /etc/hosts; and a work directory $MH_WORK (hostfile, marks, rank output) under /tmp.
# The root namespace's interfaces, routes and /etc/hosts are never touched, and 198.18.0.0/24
# (set aside for network tests, RFC 2544) exists only inside these namespaces. Everything is
# removed on exit (normal, error, Ctrl-C, TERM) by mh_cleanup, which also kills every process
# left in the namespaces; mh_setup_hosts first removes what a killed earlier run left behind.

MH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MH_PREFIX=somh
MH_ID="${MH_PREFIX}$$"
MH_SUBNET=198.18.0.0/24
MH_SKIP_CODE=77          # CTest's SKIP_RETURN_CODE for these tests
MH_TIMEOUT=${MH_TIMEOUT:-120}  # seconds one mpirun may take before it is killed
MH_BTL=${MH_BTL:-tcp,vader,self}  # Open MPI's transports: TCP between hosts, vader within one
MH_NET_NS="${MH_ID}-net"
MH_LAUNCH_NS="${MH_ID}-launch"
MH_HOSTS=()     # host names, which are also their namespaces' names
MH_BG_PIDS=()   # fault injectors started in the background
MH_RUN_PID=""   # the mpirun being waited for
MH_WORK=""
export MH_PREFIX

mh_log() { echo "multihost: $*" >&2; }

# Prints one line and returns 1 when this machine cannot run the harness (not root, no
# network or UTS namespaces, no veth/bridge, no mpirun).
mh_check_capable() {
  local tool why=""
  if (( EUID != 0 )); then
    why="not root (network namespaces need it)"
  else
    for tool in ip unshare mpirun timeout hostname; do
      command -v "$tool" >/dev/null 2>&1 || { why="no '$tool' command"; break; }
    done
  fi
  if [[ -z $why ]]; then
    local probe="${MH_ID}-probe" out
    if ! out=$(ip netns add "$probe" 2>&1); then
      why="cannot create a network namespace: $out"
    else
      if ! out=$(ip -n "$probe" link add br0 type bridge 2>&1 &&
                 ip -n "$probe" link add v0 type veth peer name v1 2>&1 &&
                 ip netns exec "$probe" unshare --uts hostname "$probe" 2>&1); then
        why="namespaces lack bridge, veth or UTS support: $out"
      fi
      ip netns del "$probe" 2>/dev/null
    fi
  fi
  if [[ -n $why ]]; then
    echo "multihost: skipped: $why"
    return 1
  fi
}

# Kills every process in namespace $1 and deletes it with its /etc/netns entry.
mh_remove_ns() {
  local ns=$1 pid pids
  pids=$(ip netns pids "$ns" 2>/dev/null)
  for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
  # Killed processes leave the namespace once reaped; deleting it right away is fine (the
  # kernel frees it with the last user), but wait briefly so no orphan outlives the call.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
    sleep 0.1
  done
  ip netns del "$ns" 2>/dev/null
  rm -rf "/etc/netns/$ns"
}

# Removes the namespaces, /etc/netns entries and work directories of harness runs whose shell
# no longer exists (killed with SIGKILL, e.g. by a CTest timeout).
mh_cleanup_stale() {
  local ns pid
  for ns in $( (ip netns list 2>/dev/null | awk '{print $1}'; ls /etc/netns 2>/dev/null) | sort -u); do
    [[ $ns =~ ^${MH_PREFIX}([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    if [[ $pid != "$$" ]] && ! kill -0 "$pid" 2>/dev/null; then
      mh_log "removing $ns left by an earlier run (process $pid is gone)"
      mh_remove_ns "$ns"
      rm -rf "/tmp/${MH_PREFIX}${pid}".* "/tmp/ompi.${MH_PREFIX}${pid}-"*
    fi
  done
}

# Everything this run made, and every process in it; safe to call twice.
mh_cleanup() {
  local pid ns
  # A second signal (timeout and Ctrl-C signal the whole process group) must not cut it short.
  trap '' INT TERM HUP
  for pid in "${MH_BG_PIDS[@]}" $MH_RUN_PID; do kill -TERM "$pid" 2>/dev/null; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns == "${MH_ID}-"* ]] && mh_remove_ns "$ns"
  done
  # Open MPI's session directories (named after the hostnames) stay behind when it is killed.
  rm -rf "/etc/netns/${MH_ID}-"* "/tmp/ompi.${MH_ID}-"*
  for pid in "${MH_BG_PIDS[@]}" $MH_RUN_PID; do wait "$pid" 2>/dev/null; done
  MH_BG_PIDS=()
  MH_RUN_PID=""
  if [[ -n $MH_WORK && -z ${MH_KEEP_WORK:-} ]]; then rm -rf "$MH_WORK"; fi
}

# Namespace $1 joined to the bridge through port $2 with address $3.
mh_attach() {
  local ns=$1 port=$2 address=$3
  ip netns add "$ns" &&
    ip -n "$ns" link set lo up &&
    ip -n "$MH_NET_NS" link add "$port" type veth peer name eth0 netns "$ns" &&
    ip -n "$MH_NET_NS" link set "$port" master br0 up &&
    ip -n "$ns" addr add "$address/24" dev eth0 &&
    ip -n "$ns" link set eth0 up
}

# Makes $1 hosts (MH_HOSTS), the bridge and the launcher namespace; installs the cleanup traps.
mh_setup_hosts() {
  local count=$1 i ns
  mh_cleanup_stale
  trap mh_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  MH_WORK=$(mktemp -d "/tmp/${MH_ID}.XXXXXX") || return 1
  mkdir -p "$MH_WORK/marks"
  export SHARDOPT_TEST_MARK_DIR="$MH_WORK/marks"
  MH_HOSTS=()
  ip netns add "$MH_NET_NS" &&
    ip -n "$MH_NET_NS" link set lo up &&
    ip -n "$MH_NET_NS" link add br0 type bridge &&
    ip -n "$MH_NET_NS" link set br0 up &&
    mh_attach "$MH_LAUNCH_NS" pl 198.18.0.2 || { mh_log "could not make the bridge"; return 1; }
  local hosts="127.0.0.1 localhost"$'\n'"198.18.0.2 $MH_LAUNCH_NS"
  for (( i = 0; i < count; ++i )); do
    ns="${MH_ID}-h$i"
    mh_attach "$ns" "p$i" "198.18.0.$((10 + i))" || { mh_log "could not make host $i"; return 1; }
    MH_HOSTS+=("$ns")
    hosts+=$'\n'"198.18.0.$((10 + i)) $ns"
  done
  for ns in "$MH_LAUNCH_NS" "${MH_HOSTS[@]}"; do
    mkdir -p "/etc/netns/$ns" && echo "$hosts" >"/etc/netns/$ns/hosts" || return 1
  done
}

# The bridge port of host $1 (a name from MH_HOSTS).
mh_port() {
  echo "p${1##*-h}"
}

# mh_mpirun SLOTS PROGRAM ARGS...: runs PROGRAM on the hosts, SLOTS[i] ranks on host i (SLOTS
# "2,2": ranks 0-1 on host 0, 2-3 on host 1; fewer entries than hosts leave the rest unused).
# Over TCP on the test subnet between hosts, shared memory within one; mpirun runs in the
# launcher namespace and starts one daemon per host through rsh_agent.sh. Extra mpirun
# options: the array MH_MPIRUN_OPTIONS. Killed after MH_TIMEOUT seconds (status 124, or 137
# when TERM did not end it). Each rank's output is also kept in files (mh_rank_output), written
# on its host, so even the ranks of a host whose link is cut leave theirs.
mh_mpirun() {
  local slots=$1 i np=0 hostfile="$MH_WORK/hostfile"
  shift
  rm -rf "$MH_WORK/output"
  local counts=()
  IFS=, read -r -a counts <<<"$slots"
  : >"$hostfile"
  for (( i = 0; i < ${#counts[@]}; ++i )); do
    echo "${MH_HOSTS[i]} slots=${counts[i]}" >>"$hostfile"
    (( np += counts[i] ))
  done
  timeout -k 10 "$MH_TIMEOUT" \
    ip netns exec "$MH_LAUNCH_NS" unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' sh "$MH_LAUNCH_NS" \
    mpirun --allow-run-as-root -np "$np" --hostfile "$hostfile" --bind-to none --leave-session-attached \
      --mca plm rsh --mca plm_rsh_agent "$MH_DIR/rsh_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
      --mca oob_tcp_if_include "$MH_SUBNET" --mca btl_tcp_if_include "$MH_SUBNET" \
      --mca pml ob1 --mca btl "$MH_BTL" --mca btl_vader_single_copy_mechanism none \
      --mca mpi_yield_when_idle 1 --output-filename "$MH_WORK/output" "${MH_MPIRUN_OPTIONS[@]}" "$@" &
  MH_RUN_PID=$!
  local status=0
  # (bash's own "Killed" notice would print the whole command line)
  wait "$MH_RUN_PID" 2>/dev/null || status=$?
  MH_RUN_PID=""
  (( status == 124 || status == 137 )) && mh_log "mpirun did not finish within ${MH_TIMEOUT}s and was killed"
  return "$status"
}

# What RANK wrote to stdout or stderr ($2, default stderr) in the last mh_mpirun.
mh_rank_output() {
  cat "$MH_WORK/output/1/rank.$1/${2:-stderr}" 2>/dev/null
}

# Waits (up to MH_TIMEOUT s) until the test program reached POINT on RANK (test_marks.hpp)
# and prints that process's PID.
mh_wait_mark() {
  local file="$SHARDOPT_TEST_MARK_DIR/$1.rank$2" deadline=$((SECONDS + MH_TIMEOUT))
  while [[ ! -s $file ]]; do
    (( SECONDS < deadline )) || return 1
    sleep 0.05
  done
  cat "$file"
}

# Forgets the marks of earlier runs (before a run that should make them afresh).
mh_clear_marks() {
  rm -f "$SHARDOPT_TEST_MARK_DIR"/*
}

# Cuts host $1's link at the bridge (from outside the host: its own eth0 stays up).
mh_cut_link() {
  ip -n "$MH_NET_NS" link set "$(mh_port "$1")" down && mh_log "cut the link of $1"
}
mh_restore_link() {
  ip -n "$MH_NET_NS" link set "$(mh_port "$1")" up && mh_log "restored the link of $1"
}

# In the background: cuts host $1's link after $2 seconds.
mh_cut_link_after() {
  ( sleep "$2" && mh_cut_link "$1" ) &
  MH_BG_PIDS+=($!)
}

# In the background: cuts host $1's link once RANK $3 reached POINT $2.
mh_cut_link_when_marked() {
  ( mh_wait_mark "$2" "$3" >/dev/null && mh_cut_link "$1" ) &
  MH_BG_PIDS+=($!)
}

# In the background: SIGKILLs (or sends signal $3) the process of RANK $2 once it reached
# POINT $1. For a kill exactly at the point, the program can do it itself instead:
# SHARDOPT_TEST_KILL_AT=POINT:RANK.
mh_kill_when_marked() {
  local point=$1 rank=$2 signal=${3:-KILL}
  (
    pid=$(mh_wait_mark "$point" "$rank") || exit 1
    kill "-$signal" "$pid" && mh_log "sent SIG$signal to rank $rank (pid $pid) at $point"
  ) &
  MH_BG_PIDS+=($!)
}

# Returns 0 when this kernel has tc's netem qdisc; otherwise prints why on stdout, one line.
mh_netem_available() {
  local out
  if ! command -v tc >/dev/null 2>&1; then
    echo "no 'tc' command (Debian package iproute2)"
    return 1
  fi
  # The kernel usually loads the module on demand; ask once more where modprobe can.
  command -v modprobe >/dev/null 2>&1 && modprobe -q sch_netem 2>/dev/null
  if ! out=$(tc -n "$MH_NET_NS" qdisc add dev br0 root netem delay 1ms 2>&1); then
    echo "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM / module sch_netem): $out"
    return 1
  fi
  tc -n "$MH_NET_NS" qdisc del dev br0 root 2>/dev/null
  return 0
}

# mh_netem HOST SPEC...: netem SPEC (e.g. "delay 5ms loss 1%") on both ends of host's link, so
# both directions see it. mh_netem_clear HOST removes it.
mh_netem() {
  local host=$1
  shift
  tc -n "$MH_NET_NS" qdisc replace dev "$(mh_port "$host")" root netem "$@" &&
    tc -n "$host" qdisc replace dev eth0 root netem "$@" && mh_log "netem $* on the link of $host"
}
mh_netem_clear() {
  tc -n "$MH_NET_NS" qdisc del dev "$(mh_port "$1")" root 2>/dev/null
  tc -n "$1" qdisc del dev eth0 root 2>/dev/null
  return 0
}

# Where the kernel has no netem, a degraded link from what it usually does have: tbf limits the
# rate on both ends of the link (packets queue, so latency grows with the traffic; beyond tbf's
# queue it drops), and the host drops a random share of the TCP packets it sends and receives.
# mh_degrade_available returns 0 when both work; otherwise prints why on stdout, one line.
mh_degrade_available() {
  local out
  if ! command -v tc >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1; then
    echo "no 'tc' or 'nft' command (Debian packages iproute2, nftables)"
    return 1
  fi
  if ! out=$(tc -n "$MH_NET_NS" qdisc add dev br0 root tbf rate 100mbit burst 32kb latency 50ms 2>&1); then
    echo "this kernel has no tbf qdisc: $out"
    return 1
  fi
  tc -n "$MH_NET_NS" qdisc del dev br0 root 2>/dev/null
  if ! out=$(ip netns exec "$MH_NET_NS" nft add table inet mhprobe 2>&1); then
    echo "this kernel has no nftables: $out"
    return 1
  fi
  ip netns exec "$MH_NET_NS" nft delete table inet mhprobe 2>/dev/null
  return 0
}

# mh_degrade HOST RATE LOSS_PER_MILLE: RATE (e.g. 50mbit) on both ends of host's link, and the
# host drops LOSS_PER_MILLE of every 1000 TCP packets it sends and of those it receives (in the
# host's namespace: the bridge's own namespace switches frames below nftables' inet hooks).
# mh_degrade_clear HOST removes both.
mh_degrade() {
  local host=$1 rate=$2 loss=$3
  tc -n "$MH_NET_NS" qdisc replace dev "$(mh_port "$host")" root tbf rate "$rate" burst 32kb latency 50ms &&
    tc -n "$host" qdisc replace dev eth0 root tbf rate "$rate" burst 32kb latency 50ms || return 1
  ip netns exec "$host" nft -f - <<EOT || return 1
table inet mhdegrade {
  chain out { type filter hook output priority 0; policy accept;
              oifname "eth0" meta l4proto tcp numgen random mod 1000 < $loss counter drop; }
  chain in { type filter hook input priority 0; policy accept;
             iifname "eth0" meta l4proto tcp numgen random mod 1000 < $loss counter drop; }
}
EOT
  mh_log "rate $rate and $loss per mille TCP loss each way on the link of $host"
}
# How many TCP packets mh_degrade has dropped on host $1 so far (both ways).
mh_degrade_dropped() {
  ip netns exec "$1" nft list table inet mhdegrade 2>/dev/null |
    grep -oE 'packets [0-9]+' | awk '{ n += $2 } END { print n + 0 }'
}
mh_degrade_clear() {
  tc -n "$MH_NET_NS" qdisc del dev "$(mh_port "$1")" root 2>/dev/null
  tc -n "$1" qdisc del dev eth0 root 2>/dev/null
  ip netns exec "$1" nft delete table inet mhdegrade 2>/dev/null
  return 0
}

# Whether host $1 can open TCP connections to address $2 (port 9, nothing listens: an answer,
# "connection refused", means the path works; a timeout means it does not).
mh_reachable() {
  local out
  out=$(ip netns exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1)
  [[ $out == *"refused"* ]]
}
