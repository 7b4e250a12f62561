#!/usr/bin/env bash
# tools/test.sh — the README's test command: installs what is missing, builds (CUDA code too when the toolkit is present), runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/install_deps.sh

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"

# Multi-rank tests run as root on CI machines, with more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
ctest --test-dir build --output-on-failure -j"$jobs"
