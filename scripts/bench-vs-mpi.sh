#!/usr/bin/env bash
# bench-vs-mpi.sh - Chorus collectives against Open MPI's, size by size.
#
# Runs R rounds, interleaved (chorus, MPI, chorus, MPI, ...), of
#   chorus-run -n N --provider P -- chorus-perf -c COLLS --json ...
#   mpirun -np N ... mpi-perf -c COLLS --json ...
# over the same sizes, keeps every JSON line, then prints, one table per
# collective (each run sweeps every collective of -c in turn), per size the median
# busbw of each, their ratio (chorus / MPI: above 1 means Chorus is faster) and
# the median time per call of each, plus the median wall time of a whole run.
# "Median" is the run of median time per size (the faster of the two middle
# runs for an even number of rounds), so time and busbw come from one run.
# The MPI transport matches the Chorus provider: shm -> btl self,vader;
# tcp and sock -> btl self,tcp over lo (and FI_TCP_IFACE=lo for Chorus, which
# sock also follows, unless set).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench-vs-mpi.sh [options]
  -c COLLS        collective, comma list of them, or all (default allreduce):
                  allreduce bcast reduce allgather reduce_scatter alltoall gather
                  scatter barrier sendrecv; one table each
  -n RANKS        ranks per run (default 2)
  -p PROVIDER     shm, tcp or sock (default shm)
  -b SIZE         smallest size, K/M/G suffixes (default 8); sizes are the whole
                  buffer of the operation, as in nccl-tests (see chorus-perf --help)
  -e SIZE         largest size (default 64M)
  -f FACTOR       size step factor (default 4)
  -r ROUNDS       rounds; each runs chorus then MPI (default 5)
  -d DTYPE        int8 uint8 int32 int64 float32 float64 (default float32)
  -o OP           sum prod min max avg (default sum; reductions only)
  --root R        root of bcast, reduce, gather, scatter (default 0)
  --algo NAME     chorus-perf --algo (CHORUS_ALGO for the collective); MPI
                  chooses its own
  -i ITERS        timed calls per size (default: the tools' own: 100 up to 1M,
                  20 up to 64M, fewer past)
  -w WARMUP       warmup calls per size (default: the tools' own, 5)
  --check         verify results too (#wrong is reported per tool)
  --inplace       in place in both tools, where the collective has that form
  --mem MODE      plain (default: posix_memalign) or lib: each tool's library
                  allocates the buffers (chorus_mem_alloc, MPI_Alloc_mem)
  --build DIR     build directory holding tools/chorus-run, tools/chorus-perf and
                  tools/mpi-perf (default ./build)
  --out DIR       keep the raw JSON lines and logs there (default: a new temp dir)
  --chorus-only   run only Chorus     --mpi-only   run only MPI
  --report DIR    run nothing: print the tables again from an earlier --out DIR
  -h, --help      this help
Exit status: 0 ok, 1 a run failed or a result was wrong, 2 bad arguments.
EOF
}

die_usage() {
  echo "bench-vs-mpi.sh: $*" >&2
  echo "Try 'scripts/bench-vs-mpi.sh --help'." >&2
  exit 2
}

ranks=2 provider=shm minb=8 maxb=64M factor=4 rounds=5 dtype=float32 op=sum colls=allreduce
iters="" warmup="" check=0 inplace=0 build=./build out="" run_chorus=1 run_mpi=1 report=""
root="" algo="" mem=plain
while [ $# -gt 0 ]; do
  case "$1" in
    -c) colls=${2:?}; shift ;;
    -n) ranks=${2:?}; shift ;;
    -p) provider=${2:?}; shift ;;
    -b) minb=${2:?}; shift ;;
    -e) maxb=${2:?}; shift ;;
    -f) factor=${2:?}; shift ;;
    -r) rounds=${2:?}; shift ;;
    -d) dtype=${2:?}; shift ;;
    -o) op=${2:?}; shift ;;
    -i) iters=${2:?}; shift ;;
    -w) warmup=${2:?}; shift ;;
    --root) root=${2:?}; shift ;;
    --algo) algo=${2:?}; shift ;;
    --check) check=1 ;;
    --inplace) inplace=1 ;;
    --mem) mem=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --chorus-only) run_mpi=0 ;;
    --mpi-only) run_chorus=0 ;;
    --report) report=${2:?}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown option '$1'" ;;
  esac
  shift
done

[[ $ranks =~ ^[1-9][0-9]*$ ]] || die_usage "-n needs a positive integer"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die_usage "-r needs a positive integer"
[[ $colls =~ ^[a-z_]+(,[a-z_]+)*$ ]] || die_usage "-c needs a collective or a comma list of them"
[ -z "$root" ] || [[ $root =~ ^[0-9]+$ ]] || die_usage "--root needs a rank"
[ "$mem" = plain ] || [ "$mem" = lib ] || die_usage "--mem must be plain or lib"
case "$provider" in
  shm) mpi_btl=(--mca btl "self,vader") ;;
  tcp|sock) mpi_btl=(--mca btl "self,tcp" --mca btl_tcp_if_include lo) ;;
  *) die_usage "-p must be shm, tcp or sock" ;;
esac
command -v python3 >/dev/null || { echo "bench-vs-mpi.sh: python3 is needed" >&2; exit 2; }

if [ -n "$report" ]; then
  [ -d "$report" ] || die_usage "--report: no directory '$report'"
  out=$report run_chorus=0 run_mpi=0
fi

chorus_run=$build/tools/chorus-run
chorus_perf=$build/tools/chorus-perf
mpi_perf=$build/tools/mpi-perf
if [ $run_chorus = 1 ]; then
  for b in "$chorus_run" "$chorus_perf"; do
    [ -x "$b" ] || die_usage "$b not found (build it, or pass --build DIR)"
  done
fi
if [ $run_mpi = 1 ]; then
  [ -x "$mpi_perf" ] || die_usage "$mpi_perf not found (is MPI installed? pass --build DIR)"
  command -v mpirun >/dev/null || die_usage "mpirun not found"
fi

if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-mpi.XXXXXX")
else
  mkdir -p "$out"
fi

perf_args=(--json -c "$colls" -b "$minb" -e "$maxb" -f "$factor" -d "$dtype" -o "$op")
if [ -n "$root" ]; then perf_args+=(--root "$root"); fi
if [ -n "$iters" ]; then perf_args+=(-n "$iters"); fi
if [ -n "$warmup" ]; then perf_args+=(-w "$warmup"); fi
if [ $check = 1 ]; then perf_args+=(--check); fi
if [ $inplace = 1 ]; then perf_args+=(--inplace); fi
if [ "$mem" = lib ]; then perf_args+=(--mem lib); fi

chorus_env=()
if [ "$provider" != shm ] && [ -z "${FI_TCP_IFACE:-}" ]; then
  chorus_env=(env FI_TCP_IFACE=lo)
fi
chorus_cmd=(${chorus_env[@]+"${chorus_env[@]}"} "$chorus_run" -n "$ranks" --provider "$provider" --no-tag --
  "$chorus_perf" "${perf_args[@]}" ${algo:+--algo "$algo"})
# pml ob1 makes the btl choice binding (it is Open MPI's default pml here too).
mpi_cmd=(mpirun --allow-run-as-root --oversubscribe -np "$ranks" --bind-to none
  --mca pml ob1 "${mpi_btl[@]}" "$mpi_perf" "${perf_args[@]}")

if [ -z "$report" ]; then
  echo "# bench-vs-mpi: $colls, $ranks ranks, provider $provider, $dtype $op, sizes" \
    "$minb..$maxb x$factor, $rounds rounds, $mem memory, raw output in $out"
else
  echo "# bench-vs-mpi: report of $out"
fi
# print a command as a shell takes it back (copy, paste, rerun one alone)
show_cmd() {
  local a line=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then line+=" $a"; else line+=" $(printf '%q' "$a")"; fi
  done
  echo "$line"
}
if [ $run_chorus = 1 ]; then echo "# chorus:$(show_cmd "${chorus_cmd[@]}")"; fi
if [ $run_mpi = 1 ]; then echo "# mpi:   $(show_cmd "${mpi_cmd[@]}")"; fi

now() { date +%s.%N; }
failed=0
# run TOOL ROUND CMD...: JSON lines to $out/TOOL-ROUND.jsonl, wall time to $out/TOOL-ROUND.wall
run() {
  local tool=$1 round=$2 t0 t1 rc=0
  shift 2
  echo "# round $round: $tool" >&2
  t0=$(now)
  "$@" >"$out/$tool-$round.jsonl" 2>"$out/$tool-$round.err" || rc=$?
  t1=$(now)
  if [ $rc -ne 0 ]; then
    echo "bench-vs-mpi.sh: $tool round $round failed (exit $rc); last lines of its stderr:" >&2
    tail -n 5 "$out/$tool-$round.err" >&2
    failed=1
    return 0
  fi
  echo "$t0 $t1" | awk '{ printf "%.6f\n", $2 - $1 }' >"$out/$tool-$round.wall"
}

for ((round = 1; round <= rounds; round++)); do
  if [ $run_chorus = 1 ]; then run chorus "$round" "${chorus_cmd[@]}"; fi
  if [ $run_mpi = 1 ]; then run mpi "$round" "${mpi_cmd[@]}"; fi
done

python3 - "$out" <<'EOF' || failed=1
import json, os, re, statistics, sys

out = sys.argv[1]
# tool -> collective -> bytes -> list of records; collectives in order of appearance
rows = {"chorus": {}, "mpi": {}}
colls = []
walls = {"chorus": [], "mpi": []}
info = {}
for tool in rows:
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(tool + r"-(\d+)\.jsonl", name)
        if not m:
            continue
        path = os.path.join(out, name)
        wall = os.path.join(out, f"{tool}-{m.group(1)}.wall")
        if os.path.exists(wall):
            with open(wall) as f:
                walls[tool].append(float(f.read()))
        with open(path) as f:
            for line in f:
                line = re.sub(r"^\[\d+\] ", "", line.strip())  # a launcher's rank tag
                if not line.startswith("{"):
                    continue
                rec = json.loads(line)
                coll = rec.get("collective", "allreduce")  # lines of older tools
                if coll not in colls:
                    colls.append(coll)
                rows[tool].setdefault(coll, {}).setdefault(rec["bytes"], []).append(rec)
                info.setdefault(tool, rec)

def median_run(recs):
    """The run of median time (the faster middle one for an even count), so
    that its time and busbw are one observation and agree with each other."""
    if not recs:
        return None
    return sorted(recs, key=lambda r: r["time_us"])[(len(recs) - 1) // 2]

def get(rec, key):
    return rec.get(key) if rec else None

def fmt(v, spec):
    if v is None:
        return "-".rjust(int(spec.split(".")[0]))
    return format(v, spec)

for tool, rec in info.items():
    print(f"# {tool}: provider {rec['provider']}, {rec['nranks']} ranks")
check = any(r.get("wrong") is not None
            for t in rows for c in rows[t] for b in rows[t][c] for r in rows[t][c][b])
bad = 0
for coll in colls:
    crows, mrows = rows["chorus"].get(coll, {}), rows["mpi"].get(coll, {})
    first = next(iter((crows or mrows).values()))[0]
    algos = sorted({r.get("algo", "?") for b in crows for r in crows[b]})
    desc = coll
    if first.get("root") is not None:
        desc += f", root {first['root']}"
    if first.get("inplace"):
        desc += ", in place"
    if algos:
        desc += f", chorus algo {'/'.join(algos)}"
    print(f"\n# {desc}")
    hdr = f"{'bytes':>12} {'count':>10} {'chorus busbw':>13} {'mpi busbw':>10} {'ratio':>7} " \
          f"{'chorus us':>11} {'mpi us':>11} {'runs c/m':>9}"
    if check:
        hdr += f" {'wrong c/m':>10}"
    print(hdr)
    print(f"{'(B)':>12} {'':>10} {'(GB/s)':>13} {'(GB/s)':>10} {'c/m':>7} {'(median)':>11} "
          f"{'(median)':>11}")
    for b in sorted(set(crows) | set(mrows)):
        c, m = crows.get(b, []), mrows.get(b, [])
        cr, mr = median_run(c), median_run(m)
        cb, mb = get(cr, "busbw_gbs"), get(mr, "busbw_gbs")
        ct, mt = get(cr, "time_us"), get(mr, "time_us")
        count = (c or m)[0]["count"]
        # busbw is 0 for 1 rank and null for barrier; compare times then (mpi / chorus)
        if cb and mb:
            ratio = cb / mb
        elif ct and mt:
            ratio = mt / ct
        else:
            ratio = None
        line = f"{b:>12} {count:>10} {fmt(cb, '13.3f')} {fmt(mb, '10.3f')} {fmt(ratio, '7.2f')} " \
               f"{fmt(ct, '11.1f')} {fmt(mt, '11.1f')} {f'{len(c)}/{len(m)}':>9}"
        if check:
            wc = sum(r["wrong"] or 0 for r in c)
            wm = sum(r["wrong"] or 0 for r in m)
            bad += wc + wm
            line += f" {f'{wc}/{wm}':>10}"
        print(line)
print()
for tool in ("chorus", "mpi"):
    if walls[tool]:
        print(f"# {tool} wall time per run: median {statistics.median(walls[tool]):.2f} s "
              f"over {len(walls[tool])} runs (min {min(walls[tool]):.2f}, max {max(walls[tool]):.2f})")
if check:
    print(f"# wrong elements, all runs: {bad} {'FAILED' if bad else 'OK'}")
sys.exit(1 if bad else 0)
EOF

[ $failed = 0 ] || echo "bench-vs-mpi.sh: some runs failed or gave wrong results; see $out" >&2
exit $failed
