#!/usr/bin/env bash
# bench/failure_compare on the CPU (gloo, torch 1.13 or the tier's torch): a rank that skips
# all_reduce #2, one that calls broadcast there instead, and one killed by SIGKILL mid-collective.
# ddprun's report must name rank 1, the culprit, as the root cause in each, and the last line
# must be the well-formed summary; torchrun's figures are printed, not asserted, and no timing is.
# Then one hang with torch's default timeout (30 min): rank 1 sleeps while the others wait in
# all_reduce, ddprun under --hang_timeout 10, each launcher cut off at 40 s. Only ddprun's Python
# hang judging can name rank 1 within that (torchrun is cut off with no verdict), and its report
# must show the frame rank 1 sleeps in. Last, --peer_cases leaves torchrun out of the cases not named.
# Usage: tests/bench/failure_compare_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }
peer=()
[[ -n "${DDPRUN_TEST_PYTHON:-}" ]] && peer=(DDPRUN_BENCH_PEER_PYTHON="$DDPRUN_TEST_PYTHON")
# The launchers' TMPDIR: ddprun keeps its run directory for the stacks of the rank it stopped as
# hung, torchrun its torchelastic_* log directory; both go with this one.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
out=$(env "${peer[@]}" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 500 "$root/bench/failure_compare" --backend gloo --timeout 5 \
  --cases skip,mismatch_op,sigkill) || rc=$?
echo "$out"
((rc == 0)) || fail "failure_compare exited $rc"
for c in skip mismatch_op sigkill; do
  grep -Eq "^$c +ddprun +[0-9.]+ +1 +[-a-z_<>]+(:[0-9]+)? +right$" <<<"$out" || fail "ddprun did not blame rank 1 in case $c"
done
last=$(tail -1 <<<"$out")
[[ "$last" =~ ^failure_compare\ backend=gloo\ cases=3\ peer_cases=3\ ddprun_right=3\ torchrun_right=[0-3]\ ddprun_max_s=[0-9.]+\ torchrun_max_s=[0-9.]+\ hang_timeout=0\ torchrun_no_verdict=0\ min_ratio=[0-9.]+$ ]] ||
  fail "summary line: $last"

rc=0
out=$(env "${peer[@]}" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 150 "$root/bench/failure_compare" --backend gloo \
  --hang_timeout 10 --limit 40 --cases sleep) || rc=$?
echo "$out"
((rc == 0)) || fail "failure_compare --hang_timeout 10 exited $rc"
grep -q "^# failure_compare: backend gloo, group timeout torch's default, ddprun --hang_timeout 10," <<<"$out" ||
  fail "the hang run's header does not say torch's default timeout and --hang_timeout 10"
# The frame: the line where rank 1 sleeps, in failure_cases.py's main().
sleep_line=$(grep -n "time.sleep(3600)" "$root/bench/failure_cases.py" | head -1 | cut -d: -f1)
grep -Eq "^sleep +ddprun +[0-9.]+ +1 +main:$sleep_line +right$" <<<"$out" ||
  fail "ddprun did not blame rank 1 at failure_cases.py:$sleep_line in the hang case sleep"
grep -Eq "^sleep +torchrun +(>40|[0-9.]+) +[-0-9]+ +[-a-z_<>:0-9]+ +(no verdict|right|wrong) +>?[0-9.]+$" <<<"$out" ||
  fail "no torchrun row with a ratio in the hang case sleep"
last=$(tail -1 <<<"$out")
[[ "$last" =~ ^failure_compare\ backend=gloo\ cases=1\ peer_cases=1\ ddprun_right=1\ torchrun_right=[01]\ ddprun_max_s=[0-9.]+\ torchrun_max_s=[0-9.]+\ hang_timeout=10\ torchrun_no_verdict=[01]\ min_ratio=\>?[0-9.]+$ ]] ||
  fail "hang summary line: $last"
rc=0
out=$(env "${peer[@]}" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 200 "$root/bench/failure_compare" --backend gloo --timeout 5 \
  --cases skip,sigkill --peer_cases sigkill --logs "$tmp/logs") || rc=$?
echo "$out"
((rc == 0)) || fail "failure_compare --peer_cases sigkill exited $rc"
grep -Eq "^skip +torchrun " <<<"$out" && fail "torchrun ran the case skip, which --peer_cases left out"
grep -Eq "^sigkill +torchrun +[0-9.]+ " <<<"$out" || fail "torchrun did not run the case sigkill"
[[ -s "$tmp/logs/skip-ddprun.log" && -s "$tmp/logs/sigkill-torchrun.log" && ! -e "$tmp/logs/skip-torchrun.log" ]] ||
  fail "--logs did not keep exactly the runs made: $(ls "$tmp/logs" | tr '\n' ' ')"
grep -q "Root cause (first failure)" "$tmp/logs/skip-ddprun.log" || fail "skip-ddprun.log is not ddprun's output"
echo "ok: ddprun named rank 1 in all 3 cases, and in the hang under --hang_timeout 10"
