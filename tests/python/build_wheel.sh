#!/usr/bin/env bash
# tests/python/build_wheel.sh — builds the shardopt wheel once with `pip wheel` (the repository's pyproject.toml) into WORK_DIR/dist, for the Python tests to install.
#
#   build_wheel.sh SOURCE_DIR WORK_DIR [LIBRARY_ARCHIVE [NAME=VALUE ...]]
# With LIBRARY_ARCHIVE (a build's libshardopt_internals.a, compiled in the configuration the wheel
# uses), the wheel links it instead of compiling the library again; the NAME=VALUE pairs go to the
# wheel's CMake as definitions (the compilers and CUDA/NCCL choice that archive was built with).
# The build tools live in a venv under WORK_DIR (PyPI reachable on the first run for
# scikit-build-core and nanobind); pip's build isolation is off so that no fresh environment is
# downloaded per build, and scikit-build-core keeps its CMake tree in WORK_DIR/wheel-build so a
# rebuild recompiles only what changed (ccache, where installed, is used too). The library is
# compiled once, into the extension, with the CPU kernels' run-time ISA dispatch (or linked from
# LIBRARY_ARCHIVE, below).
set -euo pipefail
source_dir=$1
work=$2
mkdir -p "$work"

tools="$work/build-tools"
source "$(dirname "$0")/choose_python.sh"
if [[ ! -x "$tools/bin/python" ]]; then
  "$base_python" -m venv "$tools"
fi
"$tools/bin/python" -m pip install --quiet --disable-pip-version-check scikit-build-core nanobind

# The long option: Debian 12's pip (23.0) has --config-settings but not its short form -C.
args=(--config-settings="build-dir=$work/wheel-build")
if command -v ccache >/dev/null 2>&1; then
  args+=(--config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
         --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# Always named, so that a wheel-build tree configured with an archive before forgets it.
library_archive=${3:-}
if [[ -n $library_archive && ! -f $library_archive ]]; then
  echo "$library_archive is not built: compiling the library into the wheel instead"
  library_archive=""
fi
args+=(--config-settings="cmake.define.SHARDOPT_PREBUILT_INTERNALS=$library_archive")
if [[ -n $library_archive ]]; then
  echo "linking the library already compiled in $library_archive"
  for define in "${@:4}"; do
    args+=(--config-settings="cmake.define.$define")
  done
fi
rm -rf "$work/dist"
start=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$tools/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  -w "$work/dist" "${args[@]}" "$source_dir" >"$work/wheel.log" 2>&1 ||
  { tail -n 60 "$work/wheel.log"; exit 1; }
wheels=("$work"/dist/shardopt-*.whl)
[[ -f ${wheels[0]} && ${#wheels[@]} == 1 ]] || { echo "expected one wheel in $work/dist"; ls -l "$work/dist"; exit 1; }
echo "built ${wheels[0]##*/} in $((SECONDS - start)) s"

# The extension must load without the CUDA runtime, the driver, NCCL or libfmt: what it needs
# from the system is Open MPI, OpenMP (libgomp), OpenBLAS (Muon's Newton-Schulz) and the C/C++
# runtimes.
unpacked="$work/wheel-contents"
rm -rf "$unpacked"
"$tools/bin/python" -m zipfile -e "${wheels[0]}" "$unpacked"
extension=("$unpacked"/shardopt/_shardopt*.so)
needed=$(readelf -d "${extension[0]}" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "the extension needs: $(echo $needed)"
for lib in $needed; do
  case $lib in
    libmpi.so.*|libmpi_cxx.so.*|libgomp.so.*|libopenblas.so.*|libstdc++.so.*|libm.so.*|libgcc_s.so.*|libc.so.*|ld-linux*) ;;
    *) echo "the extension needs $lib, which the wheel's README does not list"; exit 1 ;;
  esac
done
