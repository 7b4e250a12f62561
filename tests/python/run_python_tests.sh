#!/usr/bin/env bash
# tests/python/run_python_tests.sh — builds the Python module in a private venv and runs python/tests under mpirun at 1 and 2 ranks.
#
#   run_python_tests.sh SOURCE_DIR WORK_DIR
# The venv and the module's build live under WORK_DIR, so the test needs nothing installed
# system-wide beyond python3 with venv and pip (PyPI reachable for nanobind, scikit-build-core,
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
base_python=python3
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  base_python=/usr/bin/python3
fi
# A venv from an earlier run that cannot see the system's torch is made afresh.
if [[ -x "$venv/bin/python" && "$base_python" == /usr/bin/python3 ]] && ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  rm -rf "$venv"
fi
if [[ ! -x "$venv/bin/python" ]]; then
  "$base_python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check nanobind scikit-build-core numpy pytest

# The module, configured from python/ (it compiles the library itself, without -march=native).
nanobind_dir=$("$venv/bin/python" -m nanobind --cmake_dir)
cmake -S "$source_dir/python" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$venv/bin/python" -Dnanobind_DIR="$nanobind_dir" >"$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" -j"$(nproc)" --target _shardopt >"$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log"; exit 1; }

# The package as installed: python/shardopt with the built extension beside it.
package="$work/site/shardopt"
rm -rf "$work/site"
mkdir -p "$package"
cp "$source_dir"/python/shardopt/*.py "$package/"
cp "$work"/build/_shardopt*.so "$package/"

export PYTHONPATH="$work/site"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
for np in 1 2; do
  echo "== python tests, $np rank(s)"
  # -rs: a skipped module says why (the torch drop-in's tests without torch).
  mpirun -n "$np" --oversubscribe "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$source_dir/python/tests"
done

# ---- torch's ZeRO tutorial with shardopt's drop-in (its own launches: outside mpirun) ----------
# python/tests/zero_tutorial_check.py starts torchrun and mpirun itself, which must not be nested
# in an mpirun'd process: it runs here, after the mpirun'd tests, from the plain shell.
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "== torch's ZeRO tutorial: torch, shardopt under torchrun, shardopt under mpirun (2 ranks each)"
  "$venv/bin/python" "$source_dir/python/tests/zero_tutorial_check.py"
else
  echo "== torch's ZeRO tutorial: skipped: torch cannot be imported"
fi
