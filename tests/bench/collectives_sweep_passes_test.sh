#!/usr/bin/env bash
# bench/collectives_sweep --passes: every implementation measured once per pass, each point of
# the table and of the kept rows from its fastest pass (one row per point, not one per pass);
# a --passes that is not a positive number is one clear error and exit 2.
# Usage: collectives_sweep_passes_test.sh BIN_DIR (where ddprun and collectives_sweep_ddprun are)
set -euo pipefail
source "$(dirname "$0")/../support/collectives_sweep.sh"

sweep_rejects "passes '0' is not a positive number" --passes 0

timeout 200 "$root/bench/collectives_sweep" --passes 3 --impls ddprun_shm --ranks 2 --ops all_reduce,barrier \
  --max-bytes 32 --seconds 0.01 --wait-probe-ms 0 --rows "$dir/rows" >"$dir/out" 2>"$dir/err" ||
  fail "the sweep failed: $(tail -5 "$dir/out" "$dir/err")"
for pass in 1 2 3; do
  grep -q "measuring ddprun_shm at n=2 (pass $pass of 3)" "$dir/err" || fail "no pass $pass: $(cat "$dir/err")"
done
# all_reduce at 8 and 32 bytes, and the barrier: three points, each kept once.
[[ $(grep -c '^sweep_row ' "$dir/rows") -eq 3 ]] || fail "kept rows: $(cat "$dir/rows")"
for point in "op=all_reduce bytes=8 " "op=all_reduce bytes=32 " "op=barrier bytes=0 "; do
  [[ $(grep -c "$point" "$dir/rows") -eq 1 ]] || fail "'$point' kept $(grep -c "$point" "$dir/rows") times"
done
# The table and the kept rows agree on every point: both take its fastest pass.
table=$(awk '/^# n=2 op=/ { split($3, o, "="); op = o[2]; next } $1 ~ /^[0-9]+$/ { print op, $1, $5 }' "$dir/out")
kept=$(sed -n 's/.* op=\([a-z_]*\) bytes=\([0-9]*\) .* p50_us=\([0-9.]*\) .*/\1 \2 \3/p' "$dir/rows")
[[ "$(sort <<<"$table")" == "$(sort <<<"$kept")" ]] || fail "table: $table; kept rows: $kept"
echo "ok"
