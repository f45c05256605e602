#!/usr/bin/env bash
# The first command of the README: installs what Chorus needs, builds it, and
# runs the main job: a 4-rank allreduce sweep with chorus-perf on this machine,
# checking every result.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
exec ./build/tools/chorus-run -n 4 --timeout 600 -- \
  ./build/tools/chorus-perf -c allreduce -b 8 -e 64M -f 4 --check
