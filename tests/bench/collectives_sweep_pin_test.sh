#!/usr/bin/env bash
# bench/collectives_sweep --pin: every implementation's rank r runs on the list's
# (r mod length)-th CPU, as the ranks themselves report once their implementation started,
# and still measures; a CPU the host does not have fails the run with a line naming it; a
# list that is not CPU numbers is one clear error and exit 2.
# Implementations: ddprun's two always, Open MPI where its sweep was built, gloo where
# /usr/bin/python3 has torch.
# Usage: collectives_sweep_pin_test.sh BIN_DIR (where ddprun and collectives_sweep_ddprun are)
set -euo pipefail
source "$(dirname "$0")/../support/collectives_sweep.sh"

sweep_rejects "pin '0,x' is not a list of CPU numbers" --pin 0,x

impls="ddprun_shm ddprun_tcp"
[[ -x "$1/collectives_sweep_mpi" ]] && command -v mpirun >/dev/null && impls+=" mpi"
timeout 60 /usr/bin/python3 -c 'import torch' 2>/dev/null && impls+=" gloo1.13"
# The CPUs this test may use; two of them in reverse order, so that rank 0 lands where an
# unpinned rank 0 would not be put first.
read -ra cpus <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
if ((${#cpus[@]} >= 2)); then pin="${cpus[1]},${cpus[0]}"; else pin="${cpus[0]}"; fi
IFS=, read -ra list <<<"$pin"

timeout 250 "$root/bench/collectives_sweep" --pin "$pin" --impls "$impls" --ranks "2 3" --ops all_reduce \
  --max-bytes 32 --seconds 0.01 --wait-probe-ms 0 --rows "$dir/rows" >"$dir/out" 2>"$dir/err" ||
  fail "the pinned sweep failed: $(tail -5 "$dir/out" "$dir/err")"
for impl in $impls; do
  for n in 2 3; do
    for ((r = 0; r < n; ++r)); do
      want="pinned impl=$impl n=$n rank=$r cpus=${list[r % ${#list[@]}]}"
      grep -qx "$want" "$dir/out" || fail "no '$want' in: $(grep '^pinned' "$dir/out")"
    done
    # It still measures: both sizes, pinned.
    [[ $(grep -c "^sweep_row impl=$impl n=$n op=all_reduce " "$dir/rows") -eq 2 ]] ||
      fail "$impl n=$n rows: $(grep "impl=$impl n=$n" "$dir/rows")"
  done
done
grep -qF "# pinned (--pin $pin): rank r on" "$dir/rows" || fail "the rows do not say they were pinned"

# A CPU this host does not have: every implementation fails, naming it.
for impl in $impls; do
  rc=0
  timeout 120 "$root/bench/collectives_sweep" --pin "${cpus[0]},9999" --impls "$impl" --ranks 2 --ops barrier \
    --seconds 0.01 --wait-probe-ms 0 >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -eq 1 ]] || fail "$impl on CPU 9999: exit $rc, not 1"
  grep -q "cannot run rank 1 on CPU 9999" "$dir/out" || fail "$impl on CPU 9999: $(cat "$dir/out")"
done
echo "ok ($impls)"
