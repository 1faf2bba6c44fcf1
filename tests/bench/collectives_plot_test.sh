#!/usr/bin/env bash
# bench/collectives_plot on rows as bench/collectives_sweep --rows keeps them: one panel per op
# and rank count, a line per implementation, the barrier (no bandwidth) left out; a missing
# or empty rows file is one clear error and a non-zero exit. Skipped (77) without gnuplot.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v gnuplot >/dev/null || { echo "skipped: gnuplot is not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat >"$dir/rows" <<'ROWS'
sweep_row impl=ddprun_shm n=2 op=all_reduce bytes=8 count=2 type=float iters=100 p50_us=0.50 p90_us=0.60 algbw_GBps=0.016 busbw_GBps=0.016 wrong=0
sweep_row impl=ddprun_shm n=2 op=all_reduce bytes=4096 count=1024 type=float iters=100 p50_us=1.60 p90_us=1.70 algbw_GBps=2.560 busbw_GBps=2.560 wrong=0
sweep_row impl=mpi n=2 op=all_reduce bytes=8 count=2 type=float iters=100 p50_us=0.55 p90_us=0.70 algbw_GBps=0.015 busbw_GBps=0.015 wrong=0
sweep_row impl=mpi n=2 op=all_reduce bytes=4096 count=1024 type=float iters=100 p50_us=2.70 p90_us=3.00 algbw_GBps=1.517 busbw_GBps=1.517 wrong=0
sweep_row impl=gloo1.13 n=3 op=broadcast bytes=8 count=2 type=float iters=100 p50_us=150.00 p90_us=200.00 algbw_GBps=0.000 busbw_GBps=0.001 wrong=0
sweep_row impl=ddprun_shm n=2 op=barrier bytes=0 count=0 type=float iters=100 p50_us=0.30 p90_us=0.40 algbw_GBps=0.000 busbw_GBps=0.000 wrong=0
ROWS
"$root/bench/collectives_plot" "$dir/rows" "$dir/out.svg" >"$dir/log" 2>&1 || fail "plot failed: $(cat "$dir/log")"
[[ -s "$dir/out.svg" ]] || fail "no SVG written"
for text in "all_reduce, 2 ranks" "broadcast, 3 ranks" ddprun_shm mpi gloo1.13; do
  grep -q "$text" "$dir/out.svg" || fail "the SVG does not show '$text'"
done
grep -q "barrier" "$dir/out.svg" && fail "the SVG shows the barrier, which has no bandwidth"

: >"$dir/empty"
if "$root/bench/collectives_plot" "$dir/empty" "$dir/none.svg" >"$dir/log" 2>&1; then fail "empty rows accepted"; fi
grep -q "collectives_plot: '$dir/empty' is missing or empty" "$dir/log" || fail "unclear error: $(cat "$dir/log")"
[[ $(wc -l <"$dir/log") -eq 1 ]] || fail "more than one line for empty rows: $(cat "$dir/log")"
[[ -e "$dir/none.svg" ]] && fail "an SVG was written for empty rows"
echo "PASS"
