#!/usr/bin/env bash
# bench/failure_compare on the CPU (gloo, torch 1.13 or the tier's torch): a rank that skips
# all_reduce #2, one that calls broadcast there instead, and one killed by SIGKILL mid-collective.
# ddprun's report must name rank 1, the culprit, as the root cause in each, and the last line
# must be the well-formed summary; torchrun's figures are printed, not asserted, and no timing is.
# Usage: tests/bench/failure_compare_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }
peer=()
[[ -n "${DDPRUN_TEST_PYTHON:-}" ]] && peer=(DDPRUN_BENCH_PEER_PYTHON="$DDPRUN_TEST_PYTHON")
# The launchers' TMPDIR: ddprun keeps its run directory for the stacks of the rank it stopped as
# hung, torchrun its torchelastic_* log directory; both go with this one.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
out=$(env "${peer[@]}" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 600 "$root/bench/failure_compare" --backend gloo --timeout 5 \
  --cases skip,mismatch_op,sigkill) || rc=$?
echo "$out"
((rc == 0)) || fail "failure_compare exited $rc"
for c in skip mismatch_op sigkill; do
  grep -Eq "^$c +ddprun +[0-9.]+ +1 +right$" <<<"$out" || fail "ddprun did not blame rank 1 in case $c"
done
last=$(tail -1 <<<"$out")
[[ "$last" =~ ^failure_compare\ backend=gloo\ cases=3\ ddprun_right=3\ torchrun_right=[0-3]\ ddprun_max_s=[0-9.]+\ torchrun_max_s=[0-9.]+$ ]] ||
  fail "summary line: $last"
echo "ok: ddprun named rank 1 in all 3 cases"
