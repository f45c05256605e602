#!/usr/bin/env bash
# fuzz.sh [SECONDS]: build the libFuzzer targets of tests/fuzz with clang
# (ASan + UBSan) in build-fuzz/ and run each for SECONDS (default 60), with a
# corpus per target kept in build-fuzz/corpus/<target> (seeded on first use).
# Fails on any crash, leak, UB report or hang; a crashing input is saved as
# build-fuzz/artifacts/<target>-crash-*, replayable with
# build-fuzz/tests/fuzz/<target> FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
dir=build-fuzz
case $secs in
'' | *[!0-9]*)
  echo "usage: $0 [SECONDS]" >&2
  exit 2
  ;;
esac

if ! dpkg -l clang 2>/dev/null | grep -q '^ii'; then
  echo "fuzz.sh: installing clang (libFuzzer)" >&2
  sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q clang
fi

cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCHORUS_FUZZ=ON -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_MPI_BENCH=OFF >/dev/null
targets=(fuzz_boot_server fuzz_boot_client fuzz_select fuzz_topo fuzz_settings fuzz_fault_spec
  fuzz_trace_load fuzz_peer_record fuzz_rndv_desc fuzz_sock_stream)
cmake --build "$dir" -j"$(nproc)" --target fuzz_seeds "${targets[@]}"

mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/seeds"
"$dir/tests/fuzz/fuzz_seeds" "$dir/seeds"
failed=()
for t in "${targets[@]}"; do
  corpus=$dir/corpus/$t
  mkdir -p "$corpus"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$dir/artifacts/$t-")
  [ -f "$dir/seeds/$t.dict" ] && args+=(-dict="$dir/seeds/$t.dict")
  echo "== $t: ${secs}s" >&2
  # the seeds go in as a second corpus dir: read, not written
  if "$dir/tests/fuzz/$t" "${args[@]}" "$corpus" "$dir/seeds/$t" >"$dir/$t.log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|cov: ' "$dir/$t.log" | tail -3 >&2
  else
    echo "fuzz.sh: $t FAILED; see $dir/$t.log" >&2
    grep -E 'ERROR: |runtime error|SUMMARY|Test unit written' "$dir/$t.log" | head -5 >&2 || true
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: failures in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${secs}s each without a failure" >&2
