#!/bin/bash
# A peer that dies (SIGKILL) in the middle of a loop of NCCL all_reduce calls: the survivor's
# watchdog must abort the communicator and fail with an error naming the dead rank, within the
# group's timeout (20 s), never hang. Twice: torch's default (TORCH_NCCL_ASYNC_ERROR_HANDLING=3:
# the survivor's process ends, its error file says why) and with 0 (the op throws PeerError,
# the worker reports "peer error: ..." and exits 3). The two ranks are started directly
# (file:// init: no port to pick, so jobs beside this test cannot collide with it), so no
# launcher stops the survivor first.
# Usage: killed_peer_test.sh COLLECTIVES_WORKER
set -uo pipefail
worker=$1
dir=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
failed=0
for mode in 3 0; do
  pids=()
  for rank in 0 1; do
    # The worker's own loop gives up after 3 timeouts + 30 s (exit 4); `timeout` bounds a hang.
    NCCL_HOSTID="ddprun-test-rank-$rank" TORCH_NCCL_ASYNC_ERROR_HANDLING=$mode \
      TORCHELASTIC_ERROR_FILE="$dir/error.$mode.$rank" \
      timeout 200 "$worker" --init "file://$dir/init.$mode" --rank "$rank" --world-size 2 --device cuda \
      --backend nccl --victim 1 --die-after-ms 3000 --timeout-s 20 >"$dir/out.$mode.$rank" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"
  survivor=$?
  wait "${pids[1]}"
  victim=$?
  echo "mode $mode: survivor exited $survivor, victim $victim; the survivor's output:"
  tail -5 "$dir/out.$mode.0"
  expected=$((mode == 3 ? 1 : 3))
  if ((victim != 137)); then
    echo "FAILED (mode $mode): the victim exited $victim, not by SIGKILL (137)"
    failed=1
  elif ((survivor != expected)); then
    echo "FAILED (mode $mode): the survivor exited $survivor, expected $expected (124: it hung)"
    failed=1
  elif ((mode == 3)) && ! grep -q "NCCL watchdog: .*rank 1" "$dir/error.$mode.0"; then
    echo "FAILED (mode $mode): the survivor's error file does not name rank 1:"
    cat "$dir/error.$mode.0" 2>/dev/null
    failed=1
  elif ((mode == 0)) && ! grep -q "peer error: .*rank 1" "$dir/out.$mode.0"; then
    echo "FAILED (mode $mode): the survivor's PeerError does not name rank 1"
    failed=1
  else
    echo "ok (mode $mode)"
  fi
done
exit "$failed"
