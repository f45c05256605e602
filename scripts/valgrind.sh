#!/usr/bin/env bash
# valgrind.sh [--no-build] [BUILD_DIR]: valgrind memcheck on 4-rank allreduce jobs,
# every rank under memcheck, once over CHORUS_PROVIDER=shm and once over tcp (loopback).
#
# Builds (or reuses) a plain build without sanitizers in BUILD_DIR (default
# build-valgrind/: RelWithDebInfo, -O2 -g, no Criterion tests) configured with
# -DCHORUS_VALGRIND=ON, which also registers this job as the ctest test
# valgrind_memcheck (label valgrind: `ctest -L valgrind` in BUILD_DIR runs it with
# --no-build). Installs valgrind with apt-get when it is missing.
#
# Jobs per provider, each 4 ranks started by chorus-run, each rank
#   valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite ...
#   hello       examples/hello_allreduce.c: chorus_iallreduce + chorus_wait, 4 KiB avg
#   perf-auto   chorus-perf allreduce 8 B..2 MiB x8, float32 sum, out of place,
#               algorithm chosen by the cost model (rd, rhd), 3 checked iterations
#   perf-algos  chorus-perf allreduce 8 B..2 MiB x4, bfloat16 avg, in place, with
#               rd up to 1K, dbtree up to 64K, ring above
# Prints per rank the errors and the definitely / indirectly / possibly lost bytes
# and valgrind's exit status (97: memcheck found errors), then PASS or FAIL; exits 1
# on any memcheck error, any definite leak, a failed job or an incomplete log.
# Logs: BUILD_DIR/valgrind-logs/<provider>-<job>.rank<N>.log (.status: the rank's
# exit status; <provider>-<job>.out: the job's output). Suppressions:
# tests/valgrind.supp (third-party code only).
#
# Environment: VALGRIND_PROVIDERS (default "shm tcp"), VALGRIND_JOB_TIMEOUT
# (seconds per job, default 600), VALGRIND_EXTRA (more valgrind options).
set -uo pipefail

build=1
if [ "${1:-}" = --no-build ]; then
  build=0
  shift
fi
case ${1:-} in
-h | --help)
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
  ;;
-*)
  echo "usage: $0 [--no-build] [BUILD_DIR]" >&2
  exit 2
  ;;
esac
dir=${1:-}
if [ -n "$dir" ] && [ "${dir#/}" = "$dir" ]; then
  dir=$PWD/$dir # relative to where we were called from
fi
cd "$(dirname "$0")/.." || exit 1
root=$PWD
dir=${dir:-$root/build-valgrind}
nranks=4
providers=${VALGRIND_PROVIDERS:-shm tcp}
job_timeout=${VALGRIND_JOB_TIMEOUT:-600}

# ---- valgrind ----
if ! command -v valgrind >/dev/null; then
  echo "valgrind.sh: installing valgrind" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "valgrind.sh: need root or sudo to install valgrind" >&2
      exit 1
    }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends valgrind ||
    exit 1
fi

# ---- build ----
cache=$dir/CMakeCache.txt
if [ -f "$cache" ] && grep -qE '^CHORUS_(SANITIZE|FUZZ):BOOL=(ON|1|TRUE|YES)$' "$cache"; then
  echo "valgrind.sh: $dir is a sanitizer build; valgrind needs a plain one" >&2
  exit 2
fi
if [ $build = 1 ]; then
  ./scripts/deps.sh || exit 1
  opts=(-DCHORUS_VALGRIND=ON)
  if [ ! -f "$cache" ]; then # a new build: plain, optimised with symbols, no test suite
    opts+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_MPI_BENCH=OFF)
  fi
  cmake -S . -B "$dir" "${opts[@]}" >/dev/null || exit 1
  cmake --build "$dir" -j"$(nproc)" --target chorus-run chorus-perf hello_allreduce || exit 1
fi
run=$dir/tools/chorus-run
perf=$dir/tools/chorus-perf
hello=$dir/tests/valgrind/hello_allreduce
for b in "$run" "$perf" "$hello"; do
  if [ ! -x "$b" ]; then
    echo "valgrind.sh: $b is missing (build $dir with -DCHORUS_VALGRIND=ON, or run without" \
      "--no-build)" >&2
    exit 1
  fi
done

# ---- the jobs ----
logs=$dir/valgrind-logs
rm -rf "$logs" && mkdir -p "$logs" || exit 1
vg=(valgrind --tool=memcheck --error-exitcode=97 --leak-check=full
  --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-fds=no
  --num-callers=40 --suppressions="$root/tests/valgrind.supp")
# shellcheck disable=SC2206 # word splitting wanted
[ -n "${VALGRIND_EXTRA:-}" ] && vg+=(${VALGRIND_EXTRA})
export FI_TCP_IFACE=lo FI_UDP_IFACE=lo FI_SOCKETS_IFACE=lo # loopback only
# ranks run ~30x slower: the rendezvous waits for the slowest one to start up
export CHORUS_CONNECT_TIMEOUT=${CHORUS_CONNECT_TIMEOUT:-300}
unset CHORUS_TOPO CHORUS_ALGO # one host, the cost model's choice unless a job says

now() { date +%s.%N; }
status=0
failures=()
total_err=0 total_def=0 nlogs=0
t_all=$(now)

# number after "what:" in valgrind's summary lines, without thousands separators
vg_num() { sed -n "s/.*== *$1: \([0-9,]*\) .*/\1/p" "$2" | tail -1 | tr -d ,; }

# run_job PROVIDER NAME PROGRAM ARGS...
run_job() {
  local prov=$1 name=$2
  shift 2
  local tag=$prov-$name t0 rc wall
  t0=$(now)
  # Each rank records valgrind's exit status and turns memcheck's own (97: errors
  # found, known only once the rank has finished) into 0, so that chorus-run does
  # not stop the other ranks in the middle of their exit and leak check; any other
  # failure (the program's, a crash) still stops the job at once.
  # shellcheck disable=SC2016 # the rank's shell expands them
  "$run" -n $nranks --provider "$prov" --timeout "$job_timeout" -- \
    bash -c '"$@"; rc=$?; echo $rc >"$0.rank$CHORUS_RANK.status"; [ $rc -eq 97 ] && rc=0; exit $rc' \
    "$logs/$tag" "${vg[@]}" --log-file="$logs/$tag.rank%q{CHORUS_RANK}.log" "$@" \
    >"$logs/$tag.out" 2>&1
  rc=$?
  wall=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  echo "== $tag: chorus-run exit $rc, ${wall} s wall"
  local bad=0
  if [ $rc -ne 0 ]; then
    bad=1
    failures+=("$tag: chorus-run exit $rc")
  fi
  for ((r = 0; r < nranks; r++)); do
    local f=$logs/$tag.rank$r.log e d i p
    e=$([ -f "$f" ] && sed -n 's/.*ERROR SUMMARY: \([0-9,]*\) errors.*/\1/p' "$f" | tail -1 |
      tr -d ,)
    local st
    st=$(cat "$logs/$tag.rank$r.status" 2>/dev/null)
    if [ "${st:-x}" != 0 ] && [ "${st:-x}" != 97 ]; then # 97: counted below
      failures+=("$tag rank $r: exit status ${st:-unknown}")
      bad=1
    fi
    if [ -z "$e" ]; then
      echo "   rank $r: no ERROR SUMMARY in $f (killed, or did not start)"
      failures+=("$tag rank $r: incomplete log")
      bad=1
      continue
    fi
    d=$(vg_num "definitely lost" "$f")
    i=$(vg_num "indirectly lost" "$f")
    p=$(vg_num "possibly lost" "$f")
    if [ -z "$d" ] && grep -q "no leaks are possible" "$f"; then
      d=0 i=0 p=0
    fi
    if [ -z "$d" ]; then
      echo "   rank $r: no LEAK SUMMARY in $f"
      failures+=("$tag rank $r: no leak summary")
      bad=1
      continue
    fi
    nlogs=$((nlogs + 1))
    total_err=$((total_err + e))
    total_def=$((total_def + d))
    printf '   rank %d: %s errors, definitely lost %s B, indirectly lost %s B, possibly lost %s B,' \
      "$r" "$e" "$d" "${i:-0}" "${p:-0}"
    printf ' exit %s\n' "${st:-unknown}"
    if [ "$e" -ne 0 ] || [ "$d" -ne 0 ]; then
      failures+=("$tag rank $r: $e errors, $d B definitely lost")
      bad=1
    fi
  done
  if [ $bad -ne 0 ]; then
    status=1
    echo "--- $tag: job output (last 20 lines of $logs/$tag.out)"
    tail -20 "$logs/$tag.out"
    for ((r = 0; r < nranks; r++)); do
      local f=$logs/$tag.rank$r.log
      [ -f "$f" ] || continue
      if grep -qE 'ERROR SUMMARY: [1-9]|definitely lost: [1-9]' "$f"; then
        echo "--- $f (first 150 lines)"
        head -150 "$f"
      fi
    done
  fi
}

for prov in $providers; do
  run_job "$prov" hello "$hello"
  run_job "$prov" perf-auto "$perf" -c allreduce -b 8 -e 2M -f 8 -n 3 -w 1 --check
  run_job "$prov" perf-algos "$perf" -c allreduce -b 8 -e 2M -f 4 -n 3 -w 1 --check --inplace \
    -d bfloat16 -o avg --algo 'allreduce=rd:0-1K,dbtree:1K-64K,ring:64K-'
done

wall=$(awk -v a="$t_all" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
if [ $status -eq 0 ]; then
  echo "valgrind.sh: PASS: $nlogs ranks under memcheck ($providers), $total_err errors," \
    "$total_def B definitely lost, ${wall} s; logs in $logs"
else
  echo "valgrind.sh: FAIL (${wall} s; logs in $logs):"
  for f in "${failures[@]}"; do echo "   $f"; done
fi
exit $status
