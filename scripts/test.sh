#!/usr/bin/env bash
# The second command of the README: installs what Chorus needs, builds it
# twice (the sanitizer build with ASan+UBSan, then the developer build) and
# runs the whole Criterion suite under ctest in each. Exits non-zero if
# anything fails; the last lines are ctest's summary of the developer build.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh || exit 1
jobs=$(nproc)

status=0
echo "== sanitizer build (ASan + UBSan): build-asan/"
# Criterion's test processes end without failing on a sanitizer report found
# at exit, so every report also goes to a file and any file fails the run.
san_logs=$PWD/build-asan/sanitizer-logs
rm -rf "$san_logs" && mkdir -p "$san_logs"
# (no PyTorch backend there: an ASan extension inside an uninstrumented python)
if ./scripts/build.sh build-asan -DCHORUS_SANITIZE=ON -DCHORUS_BUILD_MPI_BENCH=OFF -DCHORUS_TORCH=OFF; then
  (cd build-asan &&
   ASAN_OPTIONS="detect_leaks=1:log_path=$san_logs/asan:log_exe_name=1" \
   LSAN_OPTIONS="suppressions=$PWD/../tests/lsan.supp:print_suppressions=0" \
   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$san_logs/ubsan:log_exe_name=1" \
   ctest --output-on-failure -j"$jobs" --timeout 900 -LE 'scale|heavy|valgrind|soak') || status=1
  # (label "scale": the 4096-rank verification and simulation, and "heavy":
  # every collective x algorithm x dtype x op in process and over shm and
  # tcp at 1..9 and 16 ranks, run in the developer build only - under ASan they take over ten minutes each; the
  # same code paths run sanitized through the other tests; "valgrind": scripts/valgrind.sh's
  # job, registered only in a build configured with -DCHORUS_VALGRIND=ON, never in the suite;
  # "soak": test_faults_long, the long fault matrix, and test_api_long, 10,000
  # create/destroy cycles, run by hand: ctest -L soak)
  # a log holding only the runtime's notes ("Running thread ... was not
  # suspended" in forked ranks) is no report; errors and leaks are
  reports=$(grep -lE "ERROR: |runtime error|SUMMARY: " "$san_logs"/* 2>/dev/null)
  if [ -n "$reports" ]; then
    echo "== sanitizer reports:"
    for f in $reports; do echo "--- $f"; head -60 "$f"; done
    status=1
  fi
else
  status=1
fi

echo "== developer build: build/"
if ./scripts/build.sh build; then
  (cd build && ctest --output-on-failure -j"$jobs" --timeout 900 -LE 'valgrind|soak') || status=1
else
  status=1
fi
exit $status
