#!/usr/bin/env bash
# The second command of the README: installs what Chorus needs, builds it
# twice (the sanitizer build with ASan+UBSan, then the developer build) and
# runs the whole Criterion suite under ctest in each. Exits non-zero if
# anything fails; the last lines are ctest's summary of the developer build.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh || exit 1
jobs=$(nproc)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
echo "== sanitizer build (ASan + UBSan): build-asan/"
if ./scripts/build.sh build-asan -DCHORUS_SANITIZE=ON -DCHORUS_BUILD_MPI_BENCH=OFF; then
  (cd build-asan && ctest --output-on-failure -j"$jobs" --timeout 900) || status=1
else
  status=1
fi

echo "== developer build: build/"
if ./scripts/build.sh build; then
  (cd build && ctest --output-on-failure -j"$jobs" --timeout 900) || status=1
else
  status=1
fi
exit $status
