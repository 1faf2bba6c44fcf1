#!/usr/bin/env bash
# bench/python_hook_overhead, short (one round, 20 steps, 50 calls, an in-process A/B of 2 pairs of 5 steps; torch 1.13 or the tier's
# torch): every arm runs (ddprun with the Python hook recording, with DDPRUN_FLIGHT_RECORDER=0,
# and torchrun), each is what it says (the bench checks that the "on" run's dist.all_reduce and
# DDP module are ddprun's recorded ones and the others' are not), and the table and the last
# line are well formed. No timing is asserted. A bad argument is one line and no run.
# Usage: tests/bench/python_hook_overhead_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }
peer=()
[[ -n "${DDPRUN_TEST_PYTHON:-}" ]] && peer=(DDPRUN_BENCH_PEER_PYTHON="$DDPRUN_TEST_PYTHON")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
out=$(env "${peer[@]}" DDPRUN_BIN_DIR="$1" TMPDIR="$tmp" timeout 300 "$root/bench/python_hook_overhead" --rounds 1 \
  --steps 20 --warmup 2 --calls 50 --ab_blocks 2 --ab_steps 5) || rc=$?
echo "$out"
((rc == 0)) || fail "python_hook_overhead exited $rc"
for arm in on off torchrun; do
  grep -Eq "^ +1  $arm +[0-9.]+ +[0-9.]+ +[-+][0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" <<<"$out" || fail "no row for round 1, arm $arm"
done
grep -Eq "^# pooled A/B \(2 pairs of the on runs\): recording's cost per step CPU [-+][0-9.]+% \(95% CI .*; at most 1%: (shown|not shown)" <<<"$out" ||
  fail "no pooled A/B line"
grep -Eq "^# per step: [-+][0-9.]+ us of CPU \(95% CI .*\) on a step of [0-9]+ us; within 1% for steps of at least [0-9.]+ ms" <<<"$out" ||
  fail "no per-step cost line"
grep -Eq "^# separate runs, paired by round \(1\): on/off CPU per step [-+][0-9.]+% " <<<"$out" || fail "no separate-runs line"
grep -q "^# recording on/off: steps/s ratio [0-9.]* " <<<"$out" || fail "no ratio line"
grep -Eq "^# in-process A/B .* on [0-9.]+/[0-9.]+ .*: off [0-9.]+/[0-9.]+ torchrun [0-9.]+/[0-9.]+$" <<<"$out" ||
  fail "no in-process A/B line"
last=$(tail -1 <<<"$out")
num='[0-9]+\.[0-9]+'
[[ "$last" =~ ^python_hook_overhead\ ranks=2\ rounds=1\ steps_per_s_on=$num\ steps_per_s_off=$num\ step_ratio=$num\ round_ratio=$num\ cpu_ratio=$num\ ab_cpu_ratio=$num\ ab_step_ratio=$num\ us_per_call_on=$num\ us_per_call_off=$num\ wrapper_us=-?$num\ ab_cpu_pooled=$num\ ab_cpu_ci=$num:$num\ ab_step_pooled=$num\ ab_step_ci=$num:$num\ one_percent=(shown|not_shown)\ cost_us_per_step=-?$num\ steps_per_s_torchrun=$num\ on_vs_torchrun=$num$ ]] ||
  fail "summary line: $last"
rc=0
err=$(DDPRUN_BIN_DIR="$1" timeout 30 "$root/bench/python_hook_overhead" --steps 0 2>&1 >/dev/null) || rc=$?
((rc == 1)) && [[ "$err" == "python_hook_overhead: --steps 0: must be at least 1" ]] ||
  fail "--steps 0: exit $rc, '$err'"
echo "ok: every arm ran and was what it says; the summary is well formed"
