#!/usr/bin/env bash
# bench-trace.sh - what tracing costs: chorus-perf with CHORUS_TRACE=1 (the
# default: fingerprints on every message, checkpoints, the watchdog's
# heartbeats, journal) against CHORUS_TRACE=0 and CHORUS_JOURNAL=0, in
# rounds interleaved (on, off; off, on; ...) in one run of this script, so
# the machine's noise hits both alike. Prints per size the median busbw of
# each and their ratio (on / off). --on/--off compare other settings the
# same way (e.g. --on CHORUS_CHECKSUM=1 --off CHORUS_CHECKSUM=0).
#
#   scripts/bench-trace.sh [-n RANKS] [-p PROVIDER] [-c COLL] [-r ROUNDS]
#                          [-i ITERS] [--on 'VAR=V ...'] [--off 'VAR=V ...']
#                          [--build DIR] [SIZE...]
# Sizes default to 1M and 64M; K/M/G suffixes.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2 prov=shm coll=allreduce rounds=5 iters= build=build
on_env="CHORUS_TRACE=1" off_env="CHORUS_TRACE=0 CHORUS_JOURNAL=0"
sizes=()
while [ $# -gt 0 ]; do
  case $1 in
  -n) ranks=$2; shift 2 ;;
  -p) prov=$2; shift 2 ;;
  -c) coll=$2; shift 2 ;;
  -r) rounds=$2; shift 2 ;;
  -i) iters=$2; shift 2 ;;
  --build) build=$2; shift 2 ;;
  --on) on_env=$2; shift 2 ;;
  --off) off_env=$2; shift 2 ;;
  -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
  -*) echo "bench-trace.sh: unknown option $1" >&2; exit 2 ;;
  *) sizes+=("$1"); shift ;;
  esac
done
[ ${#sizes[@]} -gt 0 ] || sizes=(1M 64M)
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # mode size
  local env
  read -r -a env <<<"$on_env"
  [ "$1" = off ] && read -r -a env <<<"$off_env"
  local extra=()
  [ -n "$iters" ] && extra=(-n "$iters")
  env "${env[@]}" "$build/tools/chorus-run" -n "$ranks" --provider "$prov" -- \
    "$build/tools/chorus-perf" -c "$coll" -b "$2" -e "$2" "${extra[@]}" --json 2>/dev/null |
    sed -n 's/^\[0\] //p' | grep '^{' >>"$out/$1-$2.jsonl"
}

# on first in odd rounds, off first in even ones: whichever goes first in a
# pair (a fresh process after the other's exit) is not always the same side
for ((r = 1; r <= rounds; r++)); do
  for s in "${sizes[@]}"; do
    if ((r % 2)); then
      run on "$s"
      run off "$s"
    else
      run off "$s"
      run on "$s"
    fi
  done
done

printf '%s, %d ranks over %s, %d rounds interleaved (median busbw, GB/s)\n' "$coll" "$ranks" \
  "$prov" "$rounds"
printf 'on: %s   off: %s\n' "$on_env" "$off_env"
printf '%-8s %12s %12s %10s\n' size on off on/off
for s in "${sizes[@]}"; do
  python3 - "$out/on-$s.jsonl" "$out/off-$s.jsonl" "$s" <<'EOF'
import json, statistics, sys
def med(path):
    v = [json.loads(l)["busbw_gbs"] for l in open(path) if l.strip()]
    return statistics.median(v), v
on, von = med(sys.argv[1])
off, voff = med(sys.argv[2])
print(f"{sys.argv[3]:<8} {on:12.3f} {off:12.3f} {on / off:10.3f}   on {['%.2f' % x for x in von]} off {['%.2f' % x for x in voff]}")
EOF
done
