#!/usr/bin/env bash
# tools/demo.sh — installs what is missing, builds the library and shardopt-demo (nothing else) and runs the demo on 2 ranks.
#
#   bash tools/demo.sh [shardopt-demo options]     e.g. bash tools/demo.sh --layers 3 --width 64
#                                                  or   bash tools/demo.sh --dtype bf16 --stage 2
#
# Fails unless the sharded and replicated runs end with bitwise identical parameters.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/install_deps.sh
shardopt_install_deps

# Only the demo and what it links (the library, its CUDA code where a toolkit is present): the
# tests, benchmarks and other tools are tools/test.sh's to build. A second run rebuilds nothing.
# The build tree is the one tools/test.sh uses, so neither command repeats the other's work.
[[ -f build/CMakeCache.txt ]] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target shardopt-demo

# The match line is printed only when both modes run (the default).
expect_match=1
previous=""
for arg in "$@"; do
  case "$arg" in
    --help | -h | --check-gradients | --mode=sharded | --mode=replicated) expect_match=0 ;;
    sharded | replicated) [[ "$previous" == --mode ]] && expect_match=0 ;;
  esac
  previous="$arg"
done

output="$(mktemp)"
trap 'rm -f "$output"' EXIT
# --oversubscribe: 2 ranks even on a 1-core machine; --allow-run-as-root: containers run as
# root. yield_when_idle keeps a waiting rank from spinning on the core its peer needs.
status=0
OMPI_MCA_mpi_yield_when_idle=1 \
  mpirun -np 2 --oversubscribe --allow-run-as-root build/tools/shardopt-demo "$@" |
  tee "$output" || status=$?
if (( status != 0 )); then
  echo "demo.sh: shardopt-demo failed (exit $status)" >&2
  exit "$status"
fi
if (( expect_match )) && ! grep -qx 'params_sum_match=yes' "$output"; then
  echo "demo.sh: the sharded and replicated runs did not end with the same parameters" >&2
  exit 1
fi
