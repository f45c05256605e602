#!/usr/bin/env bash
# bench-torch.sh - the PyTorch backend against chorus-perf and Gloo.
#
# Runs R rounds, interleaved; each round runs, for the sizes of -s:
#   chorus-run -n N --provider shm -- chorus-perf --inplace --json  (libchorus alone)
#   examples/torch/bench_allreduce.py --backend chorus                (dist.all_reduce)
#   examples/torch/bench_allreduce.py --backend gloo
#   examples/torch/bench_allreduce.py --backend chorus on 1 rank: torch's own
#     cost per call (nothing is sent), and the best torch/chorus-perf ratio it
#     leaves at each size
# and then (unless --no-ddp) examples/torch/train_ddp.py over chorus and over
# gloo (--params, --steps). Every figure is float32 SUM in place, as
# chorus-perf measures (mean time per call of the slowest rank; busbw =
# size/time * 2(n-1)/n). It prints, per size, the median busbw of each
# (the median over the rounds), the ratios torch-chorus / chorus-perf and
# torch-chorus / gloo, the median of the rounds' own torch-chorus / chorus-perf
# ratios ("by round": the machine may run slow for minutes, and a round's two
# runs are seconds apart), and the median over the rounds of each backend's median
# DDP step time with their ratio. Raw JSON lines and logs stay in --out DIR.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/bench-torch.sh [options]
  -n RANKS        ranks (default 2)
  -s SIZES        comma list of sizes, K/M/G suffixes (default 32K,2M,64M)
  -r ROUNDS       rounds (default 5)
  --params N      DDP model parameters (default 1e7)
  --steps N       DDP steps per run (default 30; the first 5 left out of its median)
  --batch N       DDP samples per rank and step (default 8: communication matters)
  --iters N       timed all_reduce calls per size, the same for chorus-perf and
                  torch (default: chorus-perf's by size, 100 up to 1 MiB; small
                  sizes want thousands for a steady figure on a shared machine)
  --warmup N      untimed calls per size first, for both (default 5)
  --no-ddp        skip the DDP runs
  --build DIR     build directory with tools/chorus-run, tools/chorus-perf and the
                  torch/python package (default ./build)
  --python PY     interpreter that imports torch (default /usr/bin/python3, else python3)
  --out DIR       keep raw output there (default: a new temp dir)
  -h, --help      this help
Exit status: 0 ok, 1 a run failed, 2 bad arguments.
EOF
}

die_usage() {
  echo "bench-torch.sh: $*" >&2
  echo "Try 'scripts/bench-torch.sh --help'." >&2
  exit 2
}

cd "$(dirname "$0")/.."
ranks=2 sizes=32K,2M,64M rounds=5 params=1e7 steps=30 batch=8 ddp=1 build=./build py="" out=""
iters=0 warmup=5
while [ $# -gt 0 ]; do
  case "$1" in
  -n) ranks=${2:?}; shift 2 ;;
  -s) sizes=${2:?}; shift 2 ;;
  -r) rounds=${2:?}; shift 2 ;;
  --params) params=${2:?}; shift 2 ;;
  --steps) steps=${2:?}; shift 2 ;;
  --batch) batch=${2:?}; shift 2 ;;
  --iters) iters=${2:?}; shift 2 ;;
  --warmup) warmup=${2:?}; shift 2 ;;
  --no-ddp) ddp=0; shift ;;
  --build) build=${2:?}; shift 2 ;;
  --python) py=${2:?}; shift 2 ;;
  --out) out=${2:?}; shift 2 ;;
  -h | --help) usage; exit 0 ;;
  *) die_usage "unknown option '$1'" ;;
  esac
done
if [ -z "$py" ]; then
  for c in /usr/bin/python3 python3; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then py=$c; break; fi
  done
  [ -n "$py" ] || die_usage "no python3 imports torch (pass --python)"
fi
for b in "$build/tools/chorus-run" "$build/tools/chorus-perf"; do
  [ -x "$b" ] || die_usage "$b not found (build it, or pass --build DIR)"
done
[ -d "$build/torch/python/chorus_torch" ] ||
  die_usage "$build/torch/python/chorus_torch not found (configure with -DCHORUS_TORCH=ON)"
build=$(cd "$build" && pwd)
export PYTHONPATH="$build/torch/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
if [ -z "$out" ]; then out=$(mktemp -d "${TMPDIR:-/tmp}/bench-torch.XXXXXX"); else mkdir -p "$out"; fi

# launch LOG SCRIPT ARGS...: RANKS ranks (or $nr) of a torch.distributed
# script, env:// on 127.0.0.1; rank 0's output goes to LOG; fails past 20 minutes.
launch() {
  local log=$1
  shift
  local port pids=() r rc=0 ranks=${nr:-$ranks}
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for ((r = 0; r < ranks; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r \
      timeout 1200 "$py" "$@" >"$log.rank$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cp "$log.rank0" "$log"
  if [ $rc != 0 ]; then
    echo "bench-torch.sh: '$*' failed; see $log.rank*" >&2
    tail -5 "$log".rank* >&2
    return 1
  fi
}

IFS=, read -r -a size_list <<<"$sizes"
perf_iters=()
[ "$iters" -gt 0 ] && perf_iters=(-n "$iters")
echo "# bench-torch: $ranks ranks, float32 SUM in place at $sizes, $rounds rounds," \
  "DDP ${params} parameters x ${steps} steps, batch $batch; raw output in $out"
for ((i = 1; i <= rounds; i++)); do
  echo "# round $i of $rounds"
  for s in "${size_list[@]}"; do
    "$build/tools/chorus-run" -n "$ranks" --provider shm --no-tag -- \
      "$build/tools/chorus-perf" -c allreduce -b "$s" -e "$s" --inplace --json \
      -w "$warmup" "${perf_iters[@]}" \
      >>"$out/perf.jsonl" 2>"$out/perf.err" ||
      { echo "bench-torch.sh: chorus-perf failed:" >&2; cat "$out/perf.err" >&2; exit 1; }
  done
  for backend in chorus gloo; do
    launch "$out/ar-$backend-$i.log" examples/torch/bench_allreduce.py --backend "$backend" \
      --sizes "$sizes" --json --warmup "$warmup" --iters "$iters" || exit 1
    cat "$out/ar-$backend-$i.log" >>"$out/torch.jsonl"
  done
  # torch's own cost per call: one rank, where Chorus has nothing to send
  nr=1 launch "$out/ar-floor-$i.log" examples/torch/bench_allreduce.py --backend chorus \
    --sizes "$sizes" --json --warmup "$warmup" --iters "$iters" || exit 1
  cat "$out/ar-floor-$i.log" >>"$out/floor.jsonl"
  if [ $ddp = 1 ]; then
    for backend in chorus gloo; do
      launch "$out/ddp-$backend-$i.log" examples/torch/train_ddp.py --backend "$backend" \
        --params "$params" --steps "$steps" --batch "$batch" --log-every 1000 || exit 1
    done
  fi
done

"$py" - "$out" "$ranks" "$rounds" "$ddp" <<'EOF'
import glob, json, re, statistics, sys
out, ranks, rounds, ddp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
perf, torch_, floor = {}, {}, {}
for line in open(f"{out}/perf.jsonl"):
    line = line.split("] ", 1)[-1] if line.startswith("[") else line
    try:
        r = json.loads(line)
    except ValueError:
        continue
    perf.setdefault(r["bytes"], []).append(r)
for line in open(f"{out}/torch.jsonl"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    torch_.setdefault((r["backend"], r["bytes"]), []).append(r)

for line in open(f"{out}/floor.jsonl"):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    floor.setdefault(r["bytes"], []).append(r["time_us"])

def med(rs):
    return statistics.median(r["busbw_gbs"] for r in rs), statistics.median(r["time_us"] for r in rs)

def human(b):
    for u, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m}{u}"
    return str(b)

print()
print(f"all_reduce float32, {ranks} ranks, median of {rounds} rounds: busbw GB/s (time us)")
print(f"{'size':>6} {'chorus-perf':>20} {'torch chorus':>20} {'torch gloo':>20} {'chorus/perf':>12} "
      f"{'by round':>9} {'chorus/gloo':>12}")
for b in sorted(perf):
    pb, pt = med(perf[b])
    if ("chorus", b) not in torch_ or ("gloo", b) not in torch_:
        continue
    cb, ct = med(torch_[("chorus", b)])
    gb, gt = med(torch_[("gloo", b)])
    # each round's torch figure against the chorus-perf run seconds before it:
    # a stretch in which the machine runs slow then weighs on both
    rr = statistics.median(c["busbw_gbs"] / p["busbw_gbs"]
                           for c, p in zip(torch_[("chorus", b)], perf[b]))
    print(f"{human(b):>6} {pb:>9.3f} ({pt:>8.1f}) {cb:>9.3f} ({ct:>8.1f}) {gb:>9.3f} ({gt:>8.1f}) "
          f"{cb / pb:>12.2f} {rr:>9.2f} {cb / gb:>12.2f}")
if floor:
    print()
    print("torch's own cost per dist.all_reduce (1 rank over chorus: nothing sent), median of the"
          " rounds,")
    print("and the best chorus/perf it leaves: perf's time / (perf's time + that cost)")
    for b in sorted(perf):
        if b not in floor:
            continue
        f = statistics.median(floor[b])
        pt = med(perf[b])[1]
        print(f"{human(b):>6} {f:>8.2f} us   best chorus/perf {pt / (pt + f):.2f}")
if ddp:
    steps, params = {}, None
    for f in sorted(glob.glob(f"{out}/ddp-*-*.log")):
        if ".rank" in f:
            continue
        backend = f.rsplit("/", 1)[1].split("-")[1]
        text = open(f).read()
        m = re.search(r"median step time ([\d.]+) ms", text)
        p = re.search(r"params (\d+)", text)
        if m:
            steps.setdefault(backend, []).append(float(m.group(1)))
        if p:
            params = int(p.group(1))
    if "chorus" in steps and "gloo" in steps:
        c, g = statistics.median(steps["chorus"]), statistics.median(steps["gloo"])
        print()
        print(f"DDP (examples/torch/train_ddp.py, {params} parameters, {ranks} ranks): median step "
              f"time, median of {rounds} rounds")
        print(f"  chorus {c:.2f} ms ({', '.join(f'{x:.1f}' for x in steps['chorus'])})")
        print(f"  gloo   {g:.2f} ms ({', '.join(f'{x:.1f}' for x in steps['gloo'])})")
        print(f"  chorus / gloo = {c / g:.3f}")
EOF
