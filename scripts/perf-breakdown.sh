#!/usr/bin/env bash
# perf-breakdown.sh [options] - where the time of a small collective goes,
# by stage: perf samples (cycles) of a chorus-perf run, every rank, summed by
# the source file (and room) of the function they fall in.
#
#   -c COLL       collective (default allreduce)
#   -b SIZE       message size (default 8)
#   -n RANKS      ranks (default 2)
#   -p PROVIDER   shm, tcp or sock (default shm)
#   -i ITERS      timed calls (default 1000000: start-up a small part)
#   --build DIR   build directory (default ./build)
#   --top N       also print the N hottest functions (default 25)
#
# Stages are the engine's files (engine/ROOM/FILE.c), providers/ and fsm/
# files, then libfabric, libc, the kernel and the rest by shared object.
# Shares are of the cycles sampled in the ranks' processes (all their
# threads; start-up and warmup included); times a share of the time per call
# chorus-perf reports, it is a rank's nanoseconds per call, where every rank
# has a core of its own. Static functions count: symbols are matched to files by nm over the
# built objects. Needs perf (linux-perf) and a kernel that lets it sample
# (kernel.perf_event_paranoid <= 2 for one's own processes).
set -euo pipefail
cd "$(dirname "$0")/.."
coll=allreduce size=8 ranks=2 provider=shm iters=1000000 build=build top=25
while [ $# -gt 0 ]; do
  case "$1" in
  -c) coll=${2:?}; shift ;;
  -b) size=${2:?}; shift ;;
  -n) ranks=${2:?}; shift ;;
  -p) provider=${2:?}; shift ;;
  -i) iters=${2:?}; shift ;;
  --build) build=${2:?}; shift ;;
  --top) top=${2:?}; shift ;;
  -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "perf-breakdown.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v perf >/dev/null || { echo "perf-breakdown.sh: perf not found (apt-get install linux-perf)" >&2; exit 2; }
for t in chorus-run chorus-perf; do
  [ -x "$build/tools/$t" ] || { echo "perf-breakdown.sh: $build/tools/$t not found (scripts/build.sh)" >&2; exit 2; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/perf-breakdown.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# symbol -> source file, from the objects of the library
find "$build/engine" "$build/providers" "$build/fsm" -name '*.c.o' | while IFS= read -r o; do
  src=${o#"$build"/}
  src=${src/CMakeFiles\/*.dir\//}
  src=${src%.o}
  [ -f "$src" ] || continue # left by a build of files since moved or removed
  nm --defined-only "$o" 2>/dev/null | awk -v f="$src" '$2 ~ /^[TtWw]$/ { print $3, f }'
done >"$tmp/syms"

env=()
[ "$provider" = shm ] || env=(FI_TCP_IFACE=lo)
env ${env[@]+"${env[@]}"} perf record -q -e cycles -F 4999 -o "$tmp/perf.data" -- \
  "$build/tools/chorus-run" -n "$ranks" --provider "$provider" --no-tag -- \
  "$build/tools/chorus-perf" -c "$coll" -b "$size" -e "$size" -n "$iters" --json >"$tmp/out" 2>"$tmp/err" ||
  { echo "perf-breakdown.sh: the run failed:" >&2; tail -n 5 "$tmp/err" >&2; exit 1; }
perf report -i "$tmp/perf.data" --no-children --sort comm,dso,sym -F overhead,comm,dso,sym \
  --stdio --percent-limit 0 2>/dev/null | grep -v '^#' | grep -v '^$' >"$tmp/report" || true

python3 - "$tmp/syms" "$tmp/report" "$tmp/out" "$top" <<'EOF'
import collections, json, re, sys

syms, report, out, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
where = {}
for line in open(syms):
    s, f = line.split()
    where.setdefault(s, f)
t_us = None
for line in open(out):
    line = re.sub(r"^\[\d+\] ", "", line.strip())
    if line.startswith("{"):
        t_us = json.loads(line)["time_us"]
stage = collections.Counter()
funcs = collections.Counter()
total = 0.0
for line in open(report):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
    if not m or m.group(2) == "chorus-run":  # the launcher, not a rank
        continue
    pct, dso, kind, sym = float(m.group(1)), m.group(3), m.group(4), m.group(5).strip()
    total += pct
    if kind == "k":
        st = "kernel"
    elif sym in where:
        st = where[sym]
    elif "libfabric" in dso:
        st = "libfabric"
    elif dso.startswith("libc.so") or dso.startswith("libc-"):
        st = "libc"
    else:
        st = dso
    stage[st] += pct
    funcs[(st, sym)] += pct
def ns(p):
    return f"{p / 100 * t_us * 1000:8.0f} ns" if t_us else ""
print(f"# chorus-perf time per call: {t_us} us" if t_us else "# no time per call in the output")
if total < 99:
    # the launcher's share, left out: the ranks' shares then sum to total
    stage = collections.Counter({k: v * 100 / total for k, v in stage.items()}) if total else stage
    funcs = collections.Counter({k: v * 100 / total for k, v in funcs.items()}) if total else funcs
print(f"# {'share':>6}  {'per call':>11}  stage (file, or shared object)")
rooms = collections.Counter()
for st, p in stage.most_common():
    if p < 0.05:
        continue
    print(f"  {p:5.1f}%  {ns(p)}  {st}")
    parts = st.split("/")
    rooms["/".join(parts[:2]) if parts[0] == "engine" and len(parts) > 2 else parts[0]] += p
print(f"# by room")
for r, p in rooms.most_common():
    if p < 0.05:
        continue
    print(f"  {p:5.1f}%  {ns(p)}  {r}")
if top:
    print(f"# the {top} hottest functions")
    for (st, sym), p in funcs.most_common(top):
        print(f"  {p:5.1f}%  {ns(p)}  {sym}  ({st})")
EOF
