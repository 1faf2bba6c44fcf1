#!/usr/bin/env bash
# bench/python_hook_pieces, short (2 ranks under ddprun, 3 rounds of 2-step blocks, a tiny MLP;
# torch 1.13 or the tier's torch): it finds every piece of the hook it toggles, prints a row per
# variant and piece for both ranks, and a well-formed last line. No timing is asserted. Without
# ddprun's hook it says so in one line and exits non-zero.
# Usage: tests/bench/python_hook_pieces_test.sh BIN_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }
python="${DDPRUN_TEST_PYTHON:-/usr/bin/python3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
out=$(PYTHON="$python" TMPDIR="$tmp" timeout 300 "$1/ddprun" --standalone --nproc_per_node=2 \
  "$root/bench/python_hook_pieces.py" --rounds 3 --block 2 --warmup 1 --hidden 8 --depth 1 --batch 2 2>&1) || rc=$?
echo "$out"
((rc == 0)) || fail "ddprun python_hook_pieces.py exited $rc"
fig='[-+][0-9.]+ \([-+][0-9.]+\.\.[-+][0-9.]+\)'
for row in "all_reduce +all_reduce - off" "forward +forward - off" "ddp +ddp - off" "ddp_at_call +ddp_at_call - off" \
  "all +all - off" "no_write +no_write - off" "backward +ddp - forward" "end_of_computation +ddp - ddp_at_call" \
  "records +all - no_write"; do
  grep -Eq "^$row +$fig +$fig +$fig +$fig +$fig *$" <<<"$out" || fail "no row '$row' with two ranks' CPU and rank 0's figures"
done
num='-?[0-9]+\.[0-9]'
last=$(grep '^python_hook_pieces ' <<<"$out" || true)
[[ "$last" =~ ^python_hook_pieces\ ranks=2\ rounds=3\ block=2\ off_cpu_us=$num\ off_wall_us=$num\ all_reduce=$num:$num:$num\ .*\ records=$num:$num:$num$ ]] ||
  fail "summary line: $last"
rc=0
err=$(timeout 120 "$python" "$root/bench/python_hook_pieces.py" 2>&1 >/dev/null) || rc=$?
((rc == 1)) && [[ "$err" == *"python_hook_pieces: ddprun's Python hook is not loaded: run this under ddprun with its recording on" ]] ||
  fail "without ddprun: exit $rc, '$err'"
echo "ok: every piece found and reported for both ranks; the summary is well formed"
