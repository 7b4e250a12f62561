#!/bin/sh
# tests/multihost/rsh_agent.sh — Open MPI's plm_rsh_agent for the multi-host harness: "logs in" to a host by entering its network namespace under its own hostname.
#
# Open MPI calls it as it would call ssh: rsh_agent.sh [options] HOST WORDS...; like ssh, the
# words are joined with spaces and run by a shell on the host. HOST is the name of one of the
# harness's network namespaces (harness.sh names each host's namespace after the host), which
# must carry the harness's prefix so that this agent never enters a namespace it did not make.
set -eu

while [ $# -gt 0 ]; do
  case $1 in
    -*) shift ;;  # ssh-style options (none are passed today): nothing to do without ssh
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "rsh_agent.sh: usage: rsh_agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
case $host in
  "${MH_PREFIX:-somh}"*) ;;
  *) echo "rsh_agent.sh: '$host' is not a host of this harness (prefix ${MH_PREFIX:-somh})" >&2; exit 255 ;;
esac
if [ ! -e "/run/netns/$host" ]; then
  echo "rsh_agent.sh: no network namespace '$host'" >&2
  exit 255
fi

# A UTS namespace of its own, so gethostname() says HOST to the daemon and to the ranks it
# starts: that is how Open MPI tells nodes apart (MPI_COMM_TYPE_SHARED, the vader BTL).
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' sh "$host" "$*"
