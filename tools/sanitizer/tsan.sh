#!/usr/bin/env bash
# tools/sanitizer/tsan.sh — ThreadSanitizer over the threaded paths: the OpenMP kernels' teams (unit tests), the background checkpoint writer (checkpoint tests), the multi-rank optimizer (MPI tests), the overlap engine's communication thread and the remote optimizer's service thread.
#
#   tools/sanitizer/tsan.sh [BUILD_DIR]     (default build-tsan)
# Builds with clang (its OpenMP runtime reports to TSan through Archer; GCC's libgomp cannot)
# and fails when TSan reports anything. tools/test.sh runs it when SHARDOPT_TSAN=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-tsan}

archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -n 1 || true)
if ! command -v clang++ >/dev/null 2>&1 || [[ -z $archer ]]; then
  echo "tsan: needs clang++ and LLVM's OpenMP with Archer (Debian packages clang, libomp-dev)" >&2
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDOPT_WITH_CUDA=OFF \
  -DSHARDOPT_SANITIZE_THREAD=ON -DSHARDOPT_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target shardopt-unit-tests shardopt-checkpoint-tests shardopt-mpi-tests \
  shardopt-overlap-tests shardopt-overlap-round-gate-tests shardopt-join-tests shardopt-averaging-tests \
  shardopt-post-local-sgd-overlap-tests shardopt-node-sharing-overlap-tests shardopt-join-averaging-tests \
  shardopt-remote-tests

# ignore_noninstrumented_modules: accesses inside libomp and libmpi themselves are not ours to
# judge (Archer supplies OpenMP's ordering); the suppressions name what remains of them.
export OMP_TOOL_LIBRARIES=$archer
export TSAN_OPTIONS="halt_on_error=0 exitcode=66 ignore_noninstrumented_modules=1 suppressions=$PWD/tools/sanitizer/tsan.supp"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
echo "== tsan: unit tests"
"$build/tests/unit/shardopt-unit-tests"
for np in 2 3; do
  echo "== tsan: checkpoint tests, $np ranks"
  mpirun --oversubscribe -np "$np" -x OMP_TOOL_LIBRARIES -x TSAN_OPTIONS "$build/tests/checkpoint/shardopt-checkpoint-tests"
done
echo "== tsan: MPI tests, 2 ranks"
mpirun --oversubscribe -np 2 -x OMP_TOOL_LIBRARIES -x TSAN_OPTIONS "$build/tests/mpi/shardopt-mpi-tests"
for np in 2 3; do
  echo "== tsan: overlap tests (communication thread), $np ranks"
  mpirun --oversubscribe -np "$np" -x OMP_TOOL_LIBRARIES -x TSAN_OPTIONS "$build/tests/mpi/shardopt-overlap-tests"
done
# The features that meet on the communication thread: overlap with Join, with per_bucket's held
# hyperparameters and the round gate, with post-local SGD and averaging (and Join refused beside
# it), with node sharing.
for program in overlap-round-gate join averaging post-local-sgd-overlap node-sharing-overlap join-averaging; do
  echo "== tsan: $program tests, 2 ranks"
  mpirun --oversubscribe -np 2 -x OMP_TOOL_LIBRARIES -x TSAN_OPTIONS "$build/tests/mpi/shardopt-$program-tests"
done
# The remote optimizer: each owner's service thread beside its caller (MPI_THREAD_MULTIPLE).
for np in 2 3; do
  echo "== tsan: remote optimizer tests (service thread), $np ranks"
  mpirun --oversubscribe -np "$np" -x OMP_TOOL_LIBRARIES -x TSAN_OPTIONS "$build/tests/remote/shardopt-remote-tests"
done
echo "tsan: no reports"
