#!/usr/bin/env bash
# tests/python/run_wheel_clean_venv.sh — installs the wheel from build_wheel.sh into a clean venv (no system site-packages, no torch) and runs a 1-rank and a 2-rank optimizer step there.
#
#   run_wheel_clean_venv.sh SOURCE_DIR WORK_DIR
# pip resolves the wheel's own dependency (numpy) from PyPI or its cache, as on a user's machine.
set -euo pipefail
source_dir=$1
work=$2
wheels=("$work"/dist/shardopt-*.whl)
[[ -f ${wheels[0]} ]] || { echo "no wheel in $work/dist: run build_wheel.sh first (CTest fixture python_wheel)"; exit 1; }

venv="$work/clean-venv"
rm -rf "$venv"
source "$(dirname "$0")/choose_python.sh"
"$base_python" -m venv "$venv"  # without --system-site-packages
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${wheels[0]}"
# Clean means clean: the system's torch must not be visible.
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "the clean venv sees torch; it is not clean"
  exit 1
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cd "$work"  # away from the source tree: only the installed package can be imported
for np in 1 2; do
  echo "== wheel in a clean venv, $np rank(s)"
  mpirun -n "$np" --oversubscribe "$venv/bin/python" "$source_dir/tests/python/wheel_smoke.py"
done
