#!/usr/bin/env bash
# bench-vs-mpi.sh - Chorus collectives against Open MPI's and MPICH's, size by size.
#
# Runs R rounds, interleaved (chorus, Open MPI, MPICH, chorus, ...), of
#   chorus-run -n N --provider P -- chorus-perf -c COLLS --json ...
#   mpirun.openmpi -np N ... mpi-perf.openmpi -c COLLS --json ...
#   mpirun.mpich -np N ... mpi-perf.mpich -c COLLS --json ...
# over the same sizes, keeps every JSON line, then prints, one table per
# collective (each run sweeps every collective of -c in turn), per size the
# median time per call of each, the ratio of the better MPI's time to
# Chorus's (above 1: Chorus is faster) and Chorus's busbw; then a verdict line
# per collective (at how many sizes Chorus is at or below the better MPI, and
# the sizes where it is not), and the median wall time of a whole run.
# "Median" is the run of median time per size (the faster of the two middle
# runs for an even number of rounds), so time and busbw come from one run.
# mpi-perf (tools/mpi-perf.c, the same loop as chorus-perf) is built here
# against each MPI with its own mpicc. The MPI transport matches the Chorus
# provider: shm -> Open MPI's btl self,vader, MPICH's default (ch4:ucx, shared
# memory); tcp and sock -> btl self,tcp over lo, UCX_TLS=tcp,self over lo (and
# FI_TCP_IFACE=lo for Chorus, which sock also follows, unless set).
#
# --markdown runs the standard matrix instead (the four main collectives from
# 8 B to 2 MiB and at 64 MiB, and barrier, over 2 ranks shm, 8 ranks shm and 2 ranks sock, by calling
# this script once per configuration and size range) and prints
# docs/performance.md whole: machine, method, the command, one table per
# collective and configuration, then the hand-written section "Machine-shape-
# specific paths and tuned thresholds" carried over from the current file.
#   scripts/bench-vs-mpi.sh --markdown > docs/performance.md.new &&
#     mv docs/performance.md.new docs/performance.md
set -euo pipefail
orig_args=("$@")

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
  -r ROUNDS       rounds; each runs chorus then each MPI (default 5)
  --mpi LIST      the MPIs to compare: openmpi, mpich or openmpi,mpich (default:
                  each installed, found as mpirun.openmpi and mpicc.openmpi, and
                  mpirun.mpich and mpicc.mpich: Debian's openmpi-bin
                  libopenmpi-dev, mpich libmpich-dev)
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
  --build DIR     build directory holding tools/chorus-run and tools/chorus-perf
                  (default ./build); mpi-perf.openmpi and mpi-perf.mpich are
                  built into its tools/ when missing or older than their sources
  --out DIR       keep the raw JSON lines and logs there (default: a new temp dir)
  --chorus-only   run only Chorus     --mpi-only   run only the MPIs
  --report DIR    run nothing: print the tables again from an earlier --out DIR
  --markdown      run the standard matrix (allreduce bcast allgather reduce_scatter,
                  8 B to 2 MiB by 8, and 64M; barrier; 2 ranks shm, 8 ranks shm, 2 ranks
                  sock; -r rounds, default 5; --mpi) and print docs/performance.md
                  whole; with --report DIR, print it from an earlier --markdown
                  --out DIR
  --quick         with --markdown: 1 round and few calls a size (a smoke run of the
                  generator, not figures to publish)
  --keep FILE     with --markdown: the file whose hand-written section is carried
                  over (default docs/performance.md)
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
root="" algo="" mem=plain markdown=0 quick=0 rounds_set=0 mpis=""
repo=$(cd "$(dirname "$0")/.." && pwd)
keep=$repo/docs/performance.md
while [ $# -gt 0 ]; do
  case "$1" in
    -c) colls=${2:?}; shift ;;
    -n) ranks=${2:?}; shift ;;
    -p) provider=${2:?}; shift ;;
    -b) minb=${2:?}; shift ;;
    -e) maxb=${2:?}; shift ;;
    -f) factor=${2:?}; shift ;;
    -r) rounds=${2:?}; rounds_set=1; shift ;;
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
    --mpi) mpis=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --chorus-only) run_mpi=0 ;;
    --mpi-only) run_chorus=0 ;;
    --report) report=${2:?}; shift ;;
    --markdown) markdown=1 ;;
    --quick) quick=1 ;;
    --keep) keep=${2:?}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die_usage "unknown option '$1'" ;;
  esac
  shift
done

if [ $markdown = 1 ]; then
  # The matrix of docs/performance.md: configurations (ranks:provider) and size
  # ranges, each a run of this script; then the file from all their JSON lines.
  [[ $rounds =~ ^[1-9][0-9]*$ ]] || die_usage "-r needs a positive integer"
  command -v python3 >/dev/null || { echo "bench-vs-mpi.sh: python3 is needed" >&2; exit 2; }
  [ -f "$keep" ] || keep=""
  md_colls=allreduce,bcast,allgather,reduce_scatter,barrier
  configs=(2:shm 8:shm 2:sock)
  if [ $quick = 1 ]; then
    [ $rounds_set = 1 ] || rounds=1
    sweeps=("small:-b 8 -e 2M -f 8 -i 20 -w 2" "large:-b 64M -e 64M -i 1 -w 1")
  else
    sweeps=("small:-b 8 -e 2M -f 8 -i 300 -w 20" "large:-b 64M -e 64M -i 5 -w 1")
  fi
  if [ -n "$report" ]; then
    out=$report
  elif [ -z "$out" ]; then
    out=$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-mpi-md.XXXXXX")
  fi
  mkdir -p "$out"
  failed=0
  if [ -z "$report" ]; then
    for cfg in "${configs[@]}"; do
      for sw in "${sweeps[@]}"; do
        dir="$out/${cfg/:/-}-${sw%%:*}"
        echo "# bench-vs-mpi --markdown: ${cfg%%:*} ranks over ${cfg#*:}, ${sw#*:}" >&2
        # shellcheck disable=SC2086 # the sweep's options are words
        colls_sw=$md_colls
        [ "${sw%%:*}" = small ] || colls_sw=${md_colls%,barrier} # barrier has no size
        # MPICH's ranks poll without yielding: where they outnumber the cores
        # a call takes milliseconds, and a sweep hours. Open MPI yields there.
        cfg_mpis=$mpis
        if [ -z "$cfg_mpis" ] && [ "${cfg%%:*}" -gt "$(nproc)" ] && command -v mpirun.openmpi >/dev/null; then
          cfg_mpis=openmpi
        fi
        "$0" -c "$colls_sw" -n "${cfg%%:*}" -p "${cfg#*:}" ${sw#*:} -r "$rounds" \
          --build "$build" --mem "$mem" ${cfg_mpis:+--mpi "$cfg_mpis"} --out "$dir" >"$dir.txt" 2>"$dir.log" || {
          echo "bench-vs-mpi.sh: ${cfg} ${sw%%:*} failed; see $dir.log" >&2
          failed=1
        }
      done
    done
    {
      echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
      echo "commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD -- engine providers fsm tools 2>/dev/null || echo ' (with uncommitted changes)')"
      echo "cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)"
      echo "cpus=$(nproc)"
      echo "l2=$(lscpu 2>/dev/null | sed -n 's/^L2 cache: *//p' | head -n1)"
      echo "l3=$(lscpu 2>/dev/null | sed -n 's/^L3 cache: *//p' | head -n1)"
      echo "kernel=$(uname -sr)"
      echo "openmpi=$(mpirun.openmpi --version 2>/dev/null | head -n1)"
      echo "mpich=$(mpichversion 2>/dev/null | sed -n 's/^MPICH Version:[[:space:]]*//p;s/^MPICH Device:[[:space:]]*//p' | paste -sd' ')"
      echo "libfabric=$(fi_info --version 2>/dev/null | sed -n 's/^libfabric: *//p')"
      echo "command=scripts/bench-vs-mpi.sh$(printf ' %s' "${orig_args[@]}")"
      echo "rounds=$rounds"
      echo "quick=$quick"
    } >"$out/machine.txt"
  fi
  PYTHONPATH="$repo/scripts" python3 - "$out" "$keep" <<'PYEOF' || failed=1
import os, re, sys
from benchlib import median_run, records as read_records, size

out, keep = sys.argv[1], sys.argv[2]
meta = {}
with open(os.path.join(out, "machine.txt")) as f:
    for line in f:
        k, _, v = line.rstrip("\n").partition("=")
        meta[k] = v
configs = [("2-shm", "2 ranks, shm"), ("8-shm", "8 ranks, shm"), ("2-sock", "2 ranks, TCP (`sock`)")]
colls = ["allreduce", "bcast", "allgather", "reduce_scatter", "barrier"]
NAMES = {"openmpi": "Open MPI", "mpich": "MPICH"}

def us(t):
    if t is None:
        return "-"
    return f"{t / 1000:.2f} ms" if t >= 10000 else f"{t:.1f} us"

# records[config][tool][coll][bytes] -> [rec]; "mpi": an older run's Open MPI
records = {}
for cfg, _ in configs:
    for name in sorted(os.listdir(out)):
        if not (name.startswith(cfg + "-") and os.path.isdir(os.path.join(out, name))):
            continue
        for fn in sorted(os.listdir(os.path.join(out, name))):
            m = re.fullmatch(r"(chorus|openmpi|mpich|mpi)-\d+\.jsonl", fn)
            if not m:
                continue
            tool = "openmpi" if m.group(1) == "mpi" else m.group(1)
            for r in read_records(os.path.join(out, name, fn)):
                (records.setdefault(cfg, {}).setdefault(tool, {})
                 .setdefault(r.get("collective", "allreduce"), {})
                 .setdefault(r["bytes"], []).append(r))
mpis = [t for t in ("openmpi", "mpich") if any(t in records.get(c, {}) for c, _ in configs)]
peers = " and ".join(NAMES[t] for t in mpis) or "MPI"

p = print
p(f"# Chorus performance against {peers}")
p()
p("<!-- Generated by scripts/bench-vs-mpi.sh --markdown (everything above \"Machine-shape-specific")
p("     paths and tuned thresholds\", which is carried over from the previous file as written). -->")
p()
p("Regenerate the whole file (a few minutes; run it on a quiet machine, nothing else running):")
p()
p("```sh")
p("./scripts/build.sh build && scripts/bench-vs-mpi.sh --markdown > docs/performance.md.new && mv docs/performance.md.new docs/performance.md")
p("```")
p()
if meta.get("quick") == "1":
    p("**Smoke run (`--quick`): one round and few calls a size. These figures show that the")
    p("generator works; they are not figures to compare.**")
    p()
p("## Machine and method")
p()
p(f"- Measured {meta.get('date', '?')} on commit {meta.get('commit', '?')}, by `{meta.get('command', '?')}`.")
p(f"- Machine: {meta.get('cpu', '?')}, {meta.get('cpus', '?')} CPUs (L2 {meta.get('l2', '?')}, L3 {meta.get('l3', '?')}), {meta.get('kernel', '?')};")
versions = []
if "openmpi" in mpis:
    versions.append(meta.get("openmpi") or meta.get("mpi", "Open MPI ?"))
if "mpich" in mpis:
    versions.append("MPICH " + meta.get("mpich", "?"))
p(f"  {'; '.join(versions)}; libfabric {meta.get('libfabric', '?')}.")
nr = meta.get('rounds', '?')
p(f"- Method: {nr} round{'' if nr == '1' else 's'}, each running Chorus (`chorus-run ... chorus-perf`), then each MPI")
p("  (`mpirun ... mpi-perf`, built against it), the same benchmark loop (`tools/perf_common.c`): float32, sum for")
p("  reductions, out of place, buffers from `posix_memalign`; 300 timed calls after 20 warmup calls from 8 B to 2 MiB,")
p("  5 after 1 at 64 MiB. A call's time is the slowest rank's; each cell is the round of median time. Sizes are the")
p("  whole buffer of the operation, as in nccl-tests, and busbw follows nccl-tests' definitions. Open MPI runs with")
p("  `--mca pml ob1` and `btl self,vader` (shm) or `btl self,tcp` over loopback (`sock`), `--bind-to none`; MPICH")
p("  (ch4:ucx) with its defaults (shm) or `UCX_TLS=tcp,self` over loopback; neither binds ranks, as Chorus does not.")
p("- Ratio: the better MPI's time over Chorus's; at or above 1, Chorus is at least as fast as both.")
p("- MPICH is left out where ranks outnumber the cores (unless `--mpi` names it): its ranks poll without")
p("  yielding, so each call waits for the kernel to switch a poller out, and takes milliseconds.")
p("- 8 ranks on this machine's CPUs means ranks outnumber the cores: every message waits for its receiver's")
p("  turn on a core, and the paths for that shape are taken (see the last section).")
for cfg, title in configs:
    for coll in colls:
        c = records.get(cfg, {}).get("chorus", {}).get(coll, {})
        ms = {t: records.get(cfg, {}).get(t, {}).get(coll, {}) for t in mpis}
        if not c and not any(ms.values()):
            continue
        p()
        p(f"## {coll}, {title}")
        p()
        p("| size | Chorus time | " + " | ".join(f"{NAMES[t]} time" for t in mpis) +
          " | Chorus busbw (GB/s) | ratio | Chorus algorithm |")
        p("|---|---|" + "---|" * len(mpis) + "---|---|---|")
        for b in sorted(set(c).union(*[set(v) for v in ms.values()])):
            cr = median_run(c.get(b, []))
            ct, cb = (cr or {}).get("time_us"), (cr or {}).get("busbw_gbs")
            mts = [(median_run(ms[t].get(b, [])) or {}).get("time_us") for t in mpis]
            known = [v for v in mts if v]
            ratio = f"{min(known) / ct:.2f}" if ct and known else "-"
            fb = f"{cb:.2f}" if cb is not None else "-"
            p(f"| {size(b)} | {us(ct)} | " + " | ".join(us(v) for v in mts) +
              f" | {fb} | {ratio} | {(cr or {}).get('algo', '-')} |")
if keep:
    with open(keep) as f:
        text = f.read()
    i = text.find("\n## Machine-shape-specific paths and tuned thresholds")
    if i >= 0:
        p()
        sys.stdout.write(text[i + 1:])
PYEOF
  exit $failed
fi

[[ $ranks =~ ^[1-9][0-9]*$ ]] || die_usage "-n needs a positive integer"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die_usage "-r needs a positive integer"
[[ $colls =~ ^[a-z_]+(,[a-z_]+)*$ ]] || die_usage "-c needs a collective or a comma list of them"
[ -z "$root" ] || [[ $root =~ ^[0-9]+$ ]] || die_usage "--root needs a rank"
[ "$mem" = plain ] || [ "$mem" = lib ] || die_usage "--mem must be plain or lib"
case "$provider" in
  shm) mpi_btl=(--mca btl "self,vader") mpich_env=() ;;
  tcp|sock)
    mpi_btl=(--mca btl "self,tcp" --mca btl_tcp_if_include lo)
    mpich_env=(env UCX_TLS=tcp,self UCX_NET_DEVICES=lo) ;;
  *) die_usage "-p must be shm, tcp or sock" ;;
esac
mpis_auto=0
if [ -z "$mpis" ]; then
  mpis_auto=1
  for m in openmpi mpich; do
    if command -v "mpirun.$m" >/dev/null && command -v "mpicc.$m" >/dev/null; then
      mpis+=${mpis:+,}$m
    fi
  done
fi
[[ $mpis =~ ^(openmpi|mpich)(,(openmpi|mpich))?$ ]] || [ $run_mpi = 0 ] || [ -n "$report" ] ||
  die_usage "--mpi needs openmpi, mpich or both, and one installed (mpirun.openmpi and mpicc.openmpi, or mpirun.mpich and mpicc.mpich)"
IFS=, read -r -a mpi_list <<<"$mpis"
if [ $mpis_auto = 1 ] && [ $run_mpi = 1 ] && [ -z "$report" ] && [ ${#mpi_list[@]} = 1 ]; then
  echo "bench-vs-mpi.sh: comparing $mpis only (for both: apt-get install openmpi-bin libopenmpi-dev mpich libmpich-dev)" >&2
fi
command -v python3 >/dev/null || { echo "bench-vs-mpi.sh: python3 is needed" >&2; exit 2; }

if [ -n "$report" ]; then
  [ -d "$report" ] || die_usage "--report: no directory '$report'"
  out=$report run_chorus=0 run_mpi=0
fi

chorus_run=$build/tools/chorus-run
chorus_perf=$build/tools/chorus-perf
if [ $run_chorus = 1 ]; then
  for b in "$chorus_run" "$chorus_perf"; do
    [ -x "$b" ] || die_usage "$b not found (build it, or pass --build DIR)"
  done
fi
# mpi-perf.MPI: tools/mpi-perf.c built against that MPI by its own mpicc
if [ $run_mpi = 1 ]; then
  for m in "${mpi_list[@]}"; do
    command -v "mpirun.$m" >/dev/null || die_usage "mpirun.$m not found (is $m installed?)"
    command -v "mpicc.$m" >/dev/null || die_usage "mpicc.$m not found (is $m's -dev package installed?)"
    bin=$build/tools/mpi-perf.$m
    if [ ! -x "$bin" ] || [ "$repo/tools/mpi-perf.c" -nt "$bin" ] ||
      [ "$repo/tools/perf_common.c" -nt "$bin" ] || [ "$repo/tools/perf_common.h" -nt "$bin" ]; then
      mkdir -p "$build/tools"
      "mpicc.$m" -O2 -Wall -o "$bin" "$repo/tools/mpi-perf.c" "$repo/tools/perf_common.c" -lm ||
        { echo "bench-vs-mpi.sh: building $bin failed" >&2; exit 2; }
    fi
  done
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
# mpi_cmd MPI: the command that runs mpi-perf over that MPI, into cmd[].
# Open MPI: pml ob1 makes the btl choice binding (it is its default pml here
# too). Neither binds ranks to cores: Chorus does not either.
mpi_cmd() {
  case "$1" in
    openmpi) cmd=(mpirun.openmpi --allow-run-as-root --oversubscribe -np "$ranks" --bind-to none
      --mca pml ob1 "${mpi_btl[@]}" "$build/tools/mpi-perf.openmpi" "${perf_args[@]}") ;;
    mpich) cmd=(${mpich_env[@]+"${mpich_env[@]}"} mpirun.mpich -np "$ranks" -host localhost
      "$build/tools/mpi-perf.mpich" "${perf_args[@]}") ;;
  esac
}

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
if [ $run_mpi = 1 ]; then
  for m in "${mpi_list[@]}"; do
    mpi_cmd "$m"
    printf '# %-7s%s\n' "$m:" "$(show_cmd "${cmd[@]}")"
  done
fi

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
  if [ $run_mpi = 1 ]; then
    for m in "${mpi_list[@]}"; do
      mpi_cmd "$m"
      run "$m" "$round" "${cmd[@]}"
    done
  fi
done

PYTHONPATH="$repo/scripts" python3 - "$out" <<'EOF' || failed=1
import os, re, statistics, sys
from benchlib import median_run, records, size

out = sys.argv[1]
TOOLS = ("chorus", "openmpi", "mpich")
NAMES = {"chorus": "Chorus", "openmpi": "Open MPI", "mpich": "MPICH"}
# tool -> collective -> bytes -> list of records; collectives in order of appearance
rows = {t: {} for t in TOOLS}
colls = []
walls = {t: [] for t in TOOLS}
info = {}
for name in sorted(os.listdir(out)):
    m = re.fullmatch(r"(chorus|openmpi|mpich|mpi)-(\d+)\.jsonl", name)
    if not m:
        continue
    tool = "openmpi" if m.group(1) == "mpi" else m.group(1)  # "mpi": an older run's Open MPI
    wall = os.path.join(out, f"{m.group(1)}-{m.group(2)}.wall")
    if os.path.exists(wall):
        with open(wall) as f:
            walls[tool].append(float(f.read()))
    for rec in records(os.path.join(out, name)):
        coll = rec.get("collective", "allreduce")  # lines of older tools
        if coll not in colls:
            colls.append(coll)
        rows[tool].setdefault(coll, {}).setdefault(rec["bytes"], []).append(rec)
        info.setdefault(tool, rec)
mpis = [t for t in ("openmpi", "mpich") if rows[t]]

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
verdicts = []
for coll in colls:
    crows = rows["chorus"].get(coll, {})
    mrows = {t: rows[t].get(coll, {}) for t in mpis}
    sizes = sorted(set(crows).union(*[set(v) for v in mrows.values()]))
    first = next(r for t in TOOLS for b in rows[t].get(coll, {}) for r in rows[t][coll][b])
    algos = sorted({r.get("algo", "?") for b in crows for r in crows[b]})
    desc = coll
    if first.get("root") is not None:
        desc += f", root {first['root']}"
    if first.get("inplace"):
        desc += ", in place"
    if algos:
        desc += f", chorus algo {'/'.join(algos)}"
    print(f"\n# {desc}")
    hdr = f"{'bytes':>12} {'count':>10} {'chorus us':>11}"
    for t in mpis:
        hdr += f" {t + ' us':>11}"
    hdr += f" {'ratio':>7} {'chorus busbw':>13} {'runs':>9}"
    if check:
        hdr += f" {'wrong':>10}"
    print(hdr)
    sub = f"{'(B)':>12} {'':>10} {'(median)':>11}" + f" {'(median)':>11}" * len(mpis)
    sub += f" {'best/c':>7} {'(GB/s)':>13} {'/'.join(['c'] + [t[0] for t in mpis]):>9}"
    print(sub)
    behind, ahead, n = [], 0, 0
    for b in sizes:
        c = crows.get(b, [])
        cr = median_run(c)
        ct = get(cr, "time_us")
        mts = {t: get(median_run(mrows[t].get(b, [])), "time_us") for t in mpis}
        known = [v for v in mts.values() if v]
        best = min(known) if known else None
        count = next(r for t in TOOLS for r in rows[t].get(coll, {}).get(b, []))["count"]
        ratio = best / ct if ct and best else None  # above 1: Chorus is faster
        line = f"{b:>12} {count:>10} {fmt(ct, '11.2f')}"
        for t in mpis:
            line += f" {fmt(mts[t], '11.2f')}"
        runs = "/".join([str(len(c))] + [str(len(mrows[t].get(b, []))) for t in mpis])
        line += f" {fmt(ratio, '7.2f')} {fmt(get(cr, 'busbw_gbs'), '13.3f')} {runs:>9}"
        if check:
            ws = [sum(r["wrong"] or 0 for r in c)] + \
                 [sum(r["wrong"] or 0 for r in mrows[t].get(b, [])) for t in mpis]
            bad += sum(ws)
            line += f" {'/'.join(map(str, ws)):>10}"
        print(line)
        if ratio is not None:
            n += 1
            if ratio >= 1:
                ahead += 1
            else:
                behind.append(f"{size(b)} {ratio:.2f}x")
    if n:
        peer = " and ".join(NAMES[t] + "'s" for t in mpis)
        peer = ("the better of " if len(mpis) > 1 else "") + peer
        tail = "" if not behind else "; behind at " + ", ".join(behind)
        verdicts.append(f"# verdict {coll}: {'PASS' if not behind else 'BEHIND'}, Chorus at or below "
                        f"{peer} time at {ahead} of {n} sizes{tail}")
print()
for v in verdicts:
    print(v)
for tool in TOOLS:
    if walls[tool]:
        print(f"# {tool} wall time per run: median {statistics.median(walls[tool]):.2f} s "
              f"over {len(walls[tool])} runs (min {min(walls[tool]):.2f}, max {max(walls[tool]):.2f})")
if check:
    print(f"# wrong elements, all runs: {bad} {'FAILED' if bad else 'OK'}")
sys.exit(1 if bad else 0)
EOF

[ $failed = 0 ] || echo "bench-vs-mpi.sh: some runs failed or gave wrong results; see $out" >&2
exit $failed
