#!/usr/bin/env bash
# build.sh [DIR] [cmake options...]: configure (once) and build Chorus in DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
