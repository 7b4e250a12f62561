#!/usr/bin/env bash
# tools/install_deps.sh — installs the Debian packages shardopt needs, only those missing, quietly.
#
# Sourced by tools/demo.sh and tools/test.sh:
#   source tools/install_deps.sh && shardopt_install_deps [extra packages...]
# or run directly: bash tools/install_deps.sh [extra packages...]
# Meant to be sourced by bash scripts, so it sets no shell options and never exits the caller.

SHARDOPT_DEB_PACKAGES=(
  cmake g++ make pkg-config
  libopenmpi-dev openmpi-bin
  catch2 libfmt-dev libopenblas-dev nlohmann-json3-dev
  # The fuzz harnesses (tests/fuzz): clang with libFuzzer and the sanitizer runtimes; LLVM's
  # OpenMP with Archer for the ThreadSanitizer build (tools/sanitizer/tsan.sh).
  clang libclang-rt-dev libomp-dev
)
# tests/multihost: namespaces, veth pairs, bridges, netem or tbf (ip, tc) and random loss (nft), a hostname per host
# (unshare), the kernel's netem module loaded on demand (modprobe).
SHARDOPT_DEB_PACKAGES+=(iproute2 util-linux kmod nftables)
# tests/python: a venv of the system python3 that sees Debian's torch (CPU, with torch.distributed
# over gloo and ZeroRedundancyOptimizer), which the torch drop-in's tests compare against.
SHARDOPT_DEB_PACKAGES+=(python3-venv python3-torch)
# python/examples/train_lm.py: its loss-curve plot.
SHARDOPT_DEB_PACKAGES+=(python3-matplotlib)

# Prints, one per line, the packages of "$@" that dpkg does not report as installed.
shardopt_missing_packages() {
  local package
  for package in "$@"; do
    # "ii " = wanted and installed; anything else (absent, half-installed, removed) is missing.
    if [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null)" != ii* ]]; then
      echo "$package"
    fi
  done
}

# Installs SHARDOPT_DEB_PACKAGES plus "$@" where missing. Runs apt-get (update first, since a
# fresh image has no package lists) only when something is missing; returns non-zero on failure.
shardopt_install_deps() {
  local packages=("${SHARDOPT_DEB_PACKAGES[@]}" "$@")
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_deps: not a Debian system; make sure these (or their equivalents) are" \
         "installed: ${packages[*]}" >&2
    return 0
  fi
  local missing=()
  mapfile -t missing < <(shardopt_missing_packages "${packages[@]}")
  if (( ${#missing[@]} == 0 )); then
    return 0
  fi

  local as_root=()
  if (( EUID != 0 )); then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "install_deps: missing packages (${missing[*]}) and not root; install them as root" >&2
      return 1
    fi
    as_root=(sudo)
  fi

  echo "install_deps: installing ${missing[*]}" >&2
  local log status=0
  log="$(mktemp)" || return 1
  {
    "${as_root[@]}" apt-get update -qq &&
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
  } >"$log" 2>&1 || status=$?
  if (( status != 0 )); then
    echo "install_deps: apt-get failed (exit $status); its last lines:" >&2
    tail -n 20 "$log" >&2
  fi
  rm -f "$log"
  return "$status"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  shardopt_install_deps "$@"
fi
