#!/usr/bin/env bash
# tests/python/run_python_tests.sh — installs the wheel that build_wheel.sh built into a private venv and runs python/tests against the installed package under mpirun at 1 and 2 ranks.
#
#   run_python_tests.sh SOURCE_DIR WORK_DIR
# WORK_DIR is build_wheel.sh's (the wheel is in WORK_DIR/dist); the venv lives there too, so the
# test needs nothing installed system-wide beyond python3 with venv and pip (PyPI reachable for
# numpy and pytest on the first run), and Debian's python3-torch for the torch drop-in's tests
# (tools/install_deps.sh installs it; without torch those tests skip).
set -euo pipefail
source_dir=$1
work=$2
mkdir -p "$work"

# Debian's python3-torch (tools/install_deps.sh) lives in the system interpreter's site-packages:
# a venv made from that interpreter with --system-site-packages sees it (and Debian's numpy, which
# that torch was built against, so pip installs no other numpy). Elsewhere, any python3 does;
# the torch tests then skip unless that interpreter has torch.
venv="$work/venv"
source "$(dirname "$0")/choose_python.sh"
# A venv from an earlier run that cannot see the system's torch is made afresh.
if [[ -x "$venv/bin/python" && "$base_python" == /usr/bin/python3 ]] && ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  rm -rf "$venv"
fi
if [[ ! -x "$venv/bin/python" ]]; then
  "$base_python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest

# The package as a user gets it: the wheel, installed (its dependency numpy is already there).
wheels=("$work"/dist/shardopt-*.whl)
[[ -f ${wheels[0]} ]] || { echo "no wheel in $work/dist: run build_wheel.sh first (CTest fixture python_wheel)"; exit 1; }
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "${wheels[0]}"
# The tests must import that installed copy, not python/shardopt from the source tree.
(cd "$work" && "$venv/bin/python" -c "import shardopt, sys; p = shardopt.__file__; print('testing', p); sys.exit(0 if p.startswith('$venv/') else 1)")

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
for np in 1 2; do
  echo "== python tests, $np rank(s)"
  # -rs: a skipped module says why (the torch drop-in's tests without torch).
  mpirun -n "$np" --oversubscribe "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$source_dir/python/tests"
done

# The remote optimizer needs MPI_THREAD_MULTIPLE from the start: its own processes, not pytest's.
for np in 1 2; do
  echo "== remote optimizer from Python, $np rank(s)"
  (cd "$work" && mpirun -n "$np" --oversubscribe "$venv/bin/python" "$source_dir/python/tests/remote_check.py")
done

# ---- torch's ZeRO tutorial with shardopt's drop-in (its own launches: outside mpirun) ----------
# python/tests/zero_tutorial_check.py starts torchrun and mpirun itself, which must not be nested
# in an mpirun'd process: it runs here, after the mpirun'd tests, from the plain shell.
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "== torch's ZeRO tutorial: torch, shardopt under torchrun, shardopt under mpirun (2 ranks each)"
  "$venv/bin/python" "$source_dir/python/tests/zero_tutorial_check.py"
  echo "== torch's overlap_with_ddp pattern (DDP hook hook_with_zero_step): shardopt under torchrun and mpirun"
  "$venv/bin/python" "$source_dir/python/tests/zero_overlap_ddp_check.py"
  echo "== torch's RPC DistributedOptimizer example: torch's class and shardopt.torch's, 2 and 3 workers"
  (cd "$work" && "$venv/bin/python" "$source_dir/python/tests/rpc_dist_optim_check.py")
else
  echo "== torch's ZeRO tutorial and overlap pattern: skipped: torch cannot be imported"
fi
