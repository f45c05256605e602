#!/usr/bin/env bash
# Installs the Debian packages Chorus needs to build, test and benchmark.
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

PKGS=(build-essential cmake pkg-config clang
      libevent-dev libfabric-dev libfabric-bin
      protobuf-c-compiler libprotobuf-c-dev libcriterion-dev
      openmpi-bin libopenmpi-dev procps
      iproute2 # multi-host tests in network namespaces (test_hosts)
      chromium # headless page check of chorus-trace (ctest -L browser)
      python3-torch libtorch-dev python3-dev pybind11-dev python3-pytest) # the PyTorch backend (torch/, ctest -L torch)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
