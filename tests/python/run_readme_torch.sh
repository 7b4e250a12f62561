#!/usr/bin/env bash
# tests/python/run_readme_torch.sh — the README's torch quick start as written: its train.py under its torchrun and mpirun lines, with the wheel installed in a venv that sees Debian's torch.
#
#   run_readme_torch.sh SOURCE_DIR WORK_DIR CMAKE MPIEXEC MPIEXEC_FLAGS
# WORK_DIR is build_wheel.sh's (the wheel is in WORK_DIR/dist). The block is extracted and run by
# tests/install/run_markdown_example.cmake; here only the environment a user would have: `python3`
# is the venv's, `torchrun` its `python3 -m torch.distributed.run` (Debian's torch installs no
# torchrun into a venv), and free ports for torch's rendezvous. Exits 77 (skipped) without torch.
set -euo pipefail
source_dir=$1
work=$2
cmake=$3
mpiexec=$4
mpiexec_flags=$5

source "$(dirname "$0")/choose_python.sh"
if ! "$base_python" -c 'import torch' >/dev/null 2>&1; then
  echo "skipped: $base_python cannot import torch"
  exit 77
fi
venv="$work/venv-readme"
if [[ ! -x "$venv/bin/python" ]]; then
  "$base_python" -m venv --system-site-packages "$venv"
fi
wheels=("$work"/dist/shardopt-*.whl)
[[ -f ${wheels[0]} ]] || { echo "no wheel in $work/dist: run build_wheel.sh first (CTest fixture python_wheel)"; exit 1; }
# numpy, the wheel's one dependency, comes from the system's site-packages with torch.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "${wheels[0]}"

bin="$work/readme-torch-bin"
mkdir -p "$bin"
skip=""
if "$venv/bin/python" -m torch.distributed.run --help >/dev/null 2>&1; then
  printf '#!/bin/sh\nexec "%s" -m torch.distributed.run "$@"\n' "$venv/bin/python" >"$bin/torchrun"
  chmod +x "$bin/torchrun"
  # torch 1.13 under Python 3.11 (Debian 12's) cannot parse its own default `--redirects 0`
  # (Std.from_str gives None): the README says to add `--redirects 2 --tee 2` there, which
  # torchrun also reads from its PET_ variables, so the README's line itself stays as written.
  if ! "$venv/bin/python" -c 'import sys; from torch.distributed.elastic.multiprocessing.api import Std; sys.exit(Std.from_str("0") is None)' >/dev/null 2>&1; then
    export PET_REDIRECTS=2 PET_TEE=2
  fi
else
  skip=torchrun
fi
port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# torchrun reads its --master_port from PET_MASTER_PORT; under mpirun the script reads MASTER_PORT.
export PET_MASTER_PORT=$(port) MASTER_PORT=$(port)
export PATH="$bin:$venv/bin:$PATH" OMP_NUM_THREADS=1
"$cmake" -DMARKDOWN="$source_dir/README.md" -DKEY=quickstart:torch -DWORK_DIR="$work/readme_torch" \
  -DMPIEXEC="$mpiexec" -DMPIEXEC_FLAGS="$mpiexec_flags" -DSKIP_LAUNCHERS="$skip" \
  -P "$source_dir/tests/install/run_markdown_example.cmake"
