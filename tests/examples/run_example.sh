#!/usr/bin/env bash
# run_example.sh BUILD_DIR NAME - one program of examples/ as a smoke test.
#
# Runs BUILD_DIR/examples/NAME under chorus-run at 4 ranks over shm with
# CHORUS_TRACE_DIR set to a fresh directory and short timeouts, then checks:
#   hello_allreduce  the job exits 0;
#   diverge_*        the job exits 0 (every rank saw the failure it expects;
#                    diverge_kill: 137, the culprit killed by signal 9), every
#                    live rank printed that code with a message naming the
#                    culprit (rank 2), left a *.trace dump, and
#                    `chorus-trace DIR` exits 0 naming the culprit in its
#                    first paragraph (and writes --html and --chrome files).
# Prints what it ran and, on failure, the job's output. Exit 0 on success.
set -u
build=${1:?usage: run_example.sh BUILD_DIR NAME}
name=${2:?usage: run_example.sh BUILD_DIR NAME}
run=$build/tools/chorus-run
trace=$build/tools/chorus-trace
prog=$build/examples/$name
n=4
culprit=2 # the examples' default: size - 2

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chorus-example-$name.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
dumps=$tmp/dumps

fail() {
  echo "FAIL $name: $*"
  echo "--- stdout"
  cat "$tmp/out"
  echo "--- stderr"
  cat "$tmp/err"
  [ -s "$tmp/trace" ] && { echo "--- chorus-trace"; cat "$tmp/trace"; }
  exit 1
}

case $name in
hello_allreduce) code= want_status=0 ;;
diverge_skip) code=CHORUS_ERR_DIVERGED want_status=0 verdict=diverged ;;
diverge_count) code=CHORUS_ERR_MISMATCH want_status=0 verdict=mismatched ;;
diverge_kill) code=CHORUS_ERR_PEER_LOST want_status=137 verdict=lost ;;
diverge_stall) code=CHORUS_ERR_TIMEOUT want_status=0 verdict=stalled ;;
*)
  echo "run_example.sh: unknown example $name" >&2
  exit 2
  ;;
esac

export CHORUS_TRACE_DIR=$dumps CHORUS_TIMEOUT=2 CHORUS_PEER_TIMEOUT=2 CHORUS_WATCHDOG_MS=200
t0=$EPOCHREALTIME
# --linger: under load, give diverge_kill's survivors time to report the loss on their own
"$run" -n $n --provider shm --timeout 60 --linger 10 -- "$prog" >"$tmp/out" 2>"$tmp/err"
status=$?
echo "$name: chorus-run exited $status after $(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $t0 }") s"
[ "$status" -eq "$want_status" ] || fail "chorus-run exited $status, expected $want_status"
[ -z "$code" ] && { echo "PASS $name"; exit 0; }

if [ "$name" = diverge_kill ]; then
  grep -q "rank $culprit killed by signal 9" "$tmp/err" || fail "rank $culprit was not killed"
fi
for ((r = 0; r < n; r++)); do
  [ "$name" = diverge_kill ] && [ $r -eq $culprit ] && continue
  # "[r] step 2 allreduce: CODE: rank r: ... rank 2 ..."
  grep -Eq "^\[$r\] [^:]+: $code: rank $r: .*rank $culprit\b" "$tmp/out" ||
    fail "rank $r did not print $code naming rank $culprit"
  compgen -G "$dumps/rank$(printf %05d $r)-*.trace" >/dev/null || fail "rank $r left no dump"
done

"$trace" "$dumps" --html "$tmp/hang.html" --chrome "$tmp/hang.json" >"$tmp/trace" 2>&1
st=$?
[ $st -eq 0 ] || fail "chorus-trace exited $st"
# the first paragraph: the diagnosis
first=$(sed '/^$/q' "$tmp/trace")
echo "$first" | grep -q "rank $culprit" || fail "chorus-trace's diagnosis does not name rank $culprit"
echo "$first" | grep -q "$verdict" || fail "chorus-trace's diagnosis does not say $verdict"
[ -s "$tmp/hang.html" ] && [ -s "$tmp/hang.json" ] || fail "chorus-trace wrote no --html/--chrome"
echo "chorus-trace: $first"
echo "PASS $name"
