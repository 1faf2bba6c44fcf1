#!/usr/bin/env bash
# bench/failure_compare's --limit with torch 2.x's torchrun as the peer (DDPRUN_TEST_PYTHON): a
# hang under torch's default timeout (rank 1 skips all_reduce #2, gloo waits 30 minutes), ddprun
# under --hang_timeout 10, each launcher cut off at 25 s. torch 2.x's torchrun starts its workers
# in sessions of their own, so the cut must stop them too: the bench must print torchrun's ">25, no
# verdict" row and its summary within the test's bound, and leave no process of the run behind
# (found by the TMPDIR the bench gives its launchers, under this test's own directory).
# Usage: tests/bench/failure_compare_limit_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -n "${DDPRUN_TEST_PYTHON:-}" ]] || fail "DDPRUN_TEST_PYTHON must name the torch 2.x python"
tmp=$(mktemp -d)
# Processes whose TMPDIR lies under this test's directory: the run's launchers and workers.
left_over() {
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "TMPDIR=$tmp/.*" && echo "${p#/proc/}"
  done
  return 0
}
cleanup() {
  local pids
  pids=$(left_over)
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
rc=0
out=$(DDPRUN_BENCH_PEER_PYTHON="$DDPRUN_TEST_PYTHON" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 150 \
  "$root/bench/failure_compare" --backend gloo --hang_timeout 10 --limit 25 --cases skip --logs "$tmp/logs") || rc=$?
echo "$out"
((rc == 0)) || fail "failure_compare exited $rc (124: still waiting on torchrun's output after its cut)"
grep -Eq "^skip +ddprun +[0-9.]+ +1 +main:[0-9]+ +right$" <<<"$out" || fail "ddprun did not blame rank 1 with its frame"
grep -Eq "^skip +torchrun +>25 +- +- +no verdict +>[0-9.]+$" <<<"$out" || fail "no torchrun row cut at 25 s"
tail -1 <<<"$out" | grep -q "torchrun_no_verdict=1 " || fail "summary line: $(tail -1 <<<"$out")"
# A SIGKILLed process is gone once its parent (or init) reaps it: give that a moment.
for _ in $(seq 50); do
  [[ -z "$(left_over)" ]] && break
  sleep 0.1
done
pids=$(left_over)
[[ -z "$pids" ]] || fail "processes of the run outlived it: $(for p in $pids; do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done)"
echo "ok: torchrun cut at 25 s with its workers, ddprun named rank 1"
