#!/usr/bin/env bash
# bench-shapes.sh [options] -- VAR=VALUE... - what a special case gains, on
# three machine shapes: Chorus as it is against Chorus with the settings
# given (the special case turned off, or another value), interleaved.
# bench-shapes.sh [options] --against DIR - the same, against another build
# (a change measured before and after: DIR holds the build before it).
#
#   shapes: 1core     2 ranks on one core (taskset -c 0)
#           cores     2 ranks on the machine's cores
#           crowded   4 ranks a core (4 x nproc ranks)
#
#   -c COLLS      collectives, comma list (default allreduce)
#   -b SIZE -e SIZE -f FACTOR   sizes, as chorus-perf (default 8 .. 2M x 64)
#   -n ITERS      timed calls a size (default: chorus-perf's own)
#   -r ROUNDS     rounds, each running the default then the alternative on
#                 every shape (default 5)
#   -p PROVIDER   shm or sock (default shm)
#   --shapes LIST which shapes (default 1core,cores,crowded)
#   --build DIR   build directory (default ./build)
#   --out DIR     keep the JSON lines there (default: a new temporary dir)
#   --against DIR the alternative is the build in DIR, not settings
#   --perf ARGS   more chorus-perf options for both, one word each, space
#                 separated (e.g. "--mem lib" or "--offset 16")
#
# Prints per shape, collective and size the median time of each and their
# ratio (alternative over default: above 1, the special case gains), then per
# shape the largest and smallest ratio, and a verdict: whether the default
# gains 5% or more anywhere (docs/performance.md, "Machine-shape-specific
# paths and tuned thresholds").
set -euo pipefail
cd "$(dirname "$0")/.."
colls=allreduce minb=8 maxb=2M factor=64 iters="" rounds=5 provider=shm
shapes=1core,cores,crowded build=build out="" against="" more=""
while [ $# -gt 0 ]; do
  case "$1" in
  -c) colls=${2:?}; shift ;;
  -b) minb=${2:?}; shift ;;
  -e) maxb=${2:?}; shift ;;
  -f) factor=${2:?}; shift ;;
  -n) iters=${2:?}; shift ;;
  -r) rounds=${2:?}; shift ;;
  -p) provider=${2:?}; shift ;;
  --shapes) shapes=${2:?}; shift ;;
  --build) build=${2:?}; shift ;;
  --out) out=${2:?}; shift ;;
  --against) against=${2:?}; shift ;;
  --perf) more=${2:?}; shift ;;
  --) shift; break ;;
  -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "bench-shapes.sh: unknown option $1 (the settings go after --)" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] || [ -n "$against" ] ||
  { echo "bench-shapes.sh: no alternative: give VAR=VALUE... after --, or --against DIR" >&2; exit 2; }
for a in "$@"; do
  [[ $a =~ ^[A-Z_][A-Z0-9_]*= ]] || { echo "bench-shapes.sh: '$a' is not VAR=VALUE" >&2; exit 2; }
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench-shapes.sh: -r needs a positive integer" >&2; exit 2; }
for t in chorus-run chorus-perf; do
  for d in "$build" ${against:+"$against"}; do
    [ -x "$d/tools/$t" ] || { echo "bench-shapes.sh: $d/tools/$t not found (scripts/build.sh)" >&2; exit 2; }
  done
done
alt_name=${against:+build $against}
alt_name=${alt_name:-$*}
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/bench-shapes.XXXXXX")
mkdir -p "$out"
cores=$(nproc)
perf_args=(--json -c "$colls" -b "$minb" -e "$maxb" -f "$factor")
[ -z "$iters" ] || perf_args+=(-n "$iters")
read -r -a more_args <<<"$more"
perf_args+=(${more_args[@]+"${more_args[@]}"})
penv=()
[ "$provider" = shm ] || penv=(FI_TCP_IFACE=lo)
echo "# bench-shapes: $colls, $minb..$maxb x$factor${more:+ ($more)}, provider $provider, $rounds rounds;" \
  "alternative: $alt_name; raw output in $out"

IFS=, read -r -a shape_list <<<"$shapes"
for ((r = 1; r <= rounds; r++)); do
  for shape in "${shape_list[@]}"; do
    case "$shape" in
    1core) pre=(taskset -c 0) n=2 ;;
    cores) pre=() n=2 ;;
    crowded) pre=() n=$((4 * cores)) ;;
    *) echo "bench-shapes.sh: unknown shape $shape" >&2; exit 2 ;;
    esac
    for v in default alt; do
      extra=() bd=$build
      [ $v = default ] || extra=("$@")
      [ $v = default ] || [ -z "$against" ] || bd=$against
      env ${penv[@]+"${penv[@]}"} ${extra[@]+"${extra[@]}"} ${pre[@]+"${pre[@]}"} \
        "$bd/tools/chorus-run" -n "$n" --provider "$provider" --no-tag -- \
        "$bd/tools/chorus-perf" "${perf_args[@]}" \
        >"$out/$shape-$v-$r.jsonl" 2>"$out/$shape-$v-$r.err" ||
        { echo "bench-shapes.sh: $shape $v round $r failed:" >&2; tail -n 3 "$out/$shape-$v-$r.err" >&2; exit 1; }
    done
  done
done

PYTHONPATH="$PWD/scripts" python3 - "$out" "$shapes" "$alt_name" <<'EOF'
import collections, glob, os, re, sys
from benchlib import median as med, records, size

out, shapes, alt = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
t = collections.defaultdict(list)  # (shape, variant, coll, bytes) -> times
for f in glob.glob(os.path.join(out, "*.jsonl")):
    m = re.fullmatch(r"(\w+)-(default|alt)-\d+\.jsonl", os.path.basename(f))
    for r in records(f):
        t[(m.group(1), m.group(2), r["collective"], r["bytes"])].append(r["time_us"])
names = {"1core": "1 core", "cores": "2 ranks, own cores", "crowded": "4 ranks a core"}
print(f"| shape | collective | size | default | {alt} | ratio |")
print("|---|---|---|---|---|---|")
best = {}
for shape in shapes:
    keys = sorted({(k[2], k[3]) for k in t if k[0] == shape})
    for coll, b in keys:
        d, a = t.get((shape, "default", coll, b)), t.get((shape, "alt", coll, b))
        if not d or not a:
            continue
        ratio = med(a) / med(d)
        lo, hi = best.get(shape, (ratio, ratio))
        best[shape] = (min(lo, ratio), max(hi, ratio))
        print(f"| {names.get(shape, shape)} | {coll} | {size(b)} | {med(d):.1f} us | {med(a):.1f} us | {ratio:.2f} |")
print()
gain = False
for shape in shapes:
    if shape in best:
        lo, hi = best[shape]
        gain |= hi >= 1.05
        print(f"# {names.get(shape, shape)}: ratio from {lo:.2f} to {hi:.2f}")
print(f"# verdict: the default {'gains 5% or more on some shape' if gain else 'gains less than 5% on every shape'}"
      f" against {alt}")
EOF
