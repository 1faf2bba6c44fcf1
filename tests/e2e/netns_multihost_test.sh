#!/usr/bin/env bash
# Multi-host elastic scenarios with ddprun agents on separate "hosts": network namespaces
# this test creates (one per node, veth pairs into a bridge in a hub namespace, addresses
# it assigns in 10.231.0.0/24). Nothing leaves these namespaces.
#   kill:  an agent killed with kill -9 mid-job is evicted; the others finish smaller
#   grow:  a late node makes the job re-form larger
#   cut:   a node whose link is cut is evicted within the keep-alive budget
#   host:  the rendezvous host's death stops the others, non-zero, naming it, in time
#   many:  four 2-node jobs at once, every node in two of them: each rank claims its own
#          job's store and checks its all_reduces; every job passes and no worker outlives it
#   hang:  (run only when named) rank 1 on node 1 never calls all_reduce #5: node 0's
#          --hang_timeout verdict, with node 1's ranks read through the store, names it;
#          the job restarts and finishes, and no flight recorder ring is left on /dev/shm
# Exit 77 (ctest: skipped) with a message where namespaces cannot be made.
# Usage: tests/e2e/netns_multihost_test.sh [-h] BIN_DIR [SCENARIO...]
set -euo pipefail
if [[ "${1:-}" == "-h" || $# -lt 1 ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bin=$1
shift
scenarios=(kill grow cut host many)
[[ $# -gt 0 ]] && scenarios=("$@")
ddprun="$bin/ddprun"

source "$(dirname "$0")/../support/netns.sh"
tag="ddpt$$"
netns_require "$tag"

work=$(mktemp -d)
# The agents' TMPDIR: the hang scenario's node keeps its run directory for the stacks it took.
export TMPDIR=$work
hub="$tag-hub"
nodes=4
cleanup() {
  netns_remove_all "$tag"
  rm -rf "$work"
}
trap cleanup EXIT

netns_star "$tag" "$nodes" 10.231.0 v "$$"
addr() { echo "10.231.0.$(($1 + 1))"; }

# Starts an agent on node $1 (remaining args: extra ddprun flags before the worker).
# ddprun's own pid goes to $work/pid.<node>, its exit code to $work/rc.<node>, its output
# to $work/out.<node> / err.<node>. Every agent is killed at the end of its scenario.
start_agent() {
  local k=$1
  shift
  rm -f "$work/pid.$k" "$work/rc.$k"
  (
    rc=0
    ip netns exec "$tag-n$k" sh -c 'echo $$ > "$0"; exec "$@"' "$work/pid.$k" "$ddprun" --nproc_per_node=1 \
      --rdzv_backend=c10d --rdzv_endpoint="$(addr 0):29400" --local_addr="$(addr "$k")" --rdzv_id="$scenario" "$@" \
      --no_python sh -c 'echo "W rank=$RANK world=$WORLD_SIZE nodes=$GROUP_WORLD_SIZE"; '"$WORKER" \
      >"$work/out.$k" 2>"$work/err.$k" || rc=$?
    echo "$rc" >"$work/rc.$k"
  ) &
  local deadline=$((SECONDS + 10))
  until [[ -s "$work/pid.$k" ]]; do ((SECONDS < deadline)) || break; sleep 0.01; done
}
wait_for_line() {  # node, pattern, seconds
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$work/out.$1" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "FAIL: node $1 never printed '$2'"; cat "$work/err.$1"; return 1; }
    sleep 0.05
  done
}
exit_code_of() {  # node, seconds -> prints the agent's exit code (or "timeout")
  local deadline=$((SECONDS + $2))
  until [[ -s "$work/rc.$1" ]]; do
    ((SECONDS < deadline)) || { echo timeout; return; }
    sleep 0.05
  done
  cat "$work/rc.$1"
}
expect_exit() {  # node, expected code, seconds, what
  local got
  got=$(exit_code_of "$1" "$3")
  if [[ "$got" != "$2" ]]; then
    echo "FAIL [$scenario]: node $1 exited '$got', expected $2 ($4)"
    tail -5 "$work/err.$1"
    return 1
  fi
}
fast="keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=0.5,read_timeout=3,join_timeout=30"

passed=0
failed=0
for scenario in "${scenarios[@]}"; do
  rm -f "$work"/out.* "$work"/err.* "$work"/pid.* "$work"/rc.*
  ok=true
  case "$scenario" in
    kill)
      WORKER='if [ "$GROUP_WORLD_SIZE" = 3 ]; then exec sleep 60; fi'
      for k in 0 1 2; do start_agent "$k" --nnodes=2:3 --rdzv_conf="$fast"; done
      for k in 0 1 2; do wait_for_line "$k" "nodes=3" 30 || ok=false; done
      kill -9 "$(cat "$work/pid.2")"
      for k in 0 1; do expect_exit "$k" 0 30 "survivors finish" || ok=false; done
      grep -q "evict:" "$work/err.0" "$work/err.1" || { echo "FAIL [kill]: no eviction logged"; ok=false; }
      grep -q "nodes=2" "$work/out.0" || { echo "FAIL [kill]: no smaller world"; ok=false; }
      ;;
    grow)
      WORKER='if [ "$GROUP_WORLD_SIZE" != 3 ]; then exec sleep 60; fi'
      for k in 0 1; do start_agent "$k" --nnodes=2:3 --rdzv_conf="$fast"; done
      for k in 0 1; do wait_for_line "$k" "nodes=2" 30 || ok=false; done
      start_agent 2 --nnodes=2:3 --rdzv_conf="$fast"
      for k in 0 1 2; do expect_exit "$k" 0 30 "the grown job finishes" || ok=false; done
      ranks=$(cat "$work"/out.* | grep "nodes=3" | sed 's/.*rank=\([0-9]*\).*/\1/' | sort -n | tr '\n' ' ')
      [[ "$ranks" == "0 1 2 " ]] || { echo "FAIL [grow]: ranks in the grown job: '$ranks'"; ok=false; }
      ;;
    cut)
      WORKER='if [ "$GROUP_WORLD_SIZE" = 3 ]; then exec sleep 60; fi'
      for k in 0 1 2; do start_agent "$k" --nnodes=2:3 --rdzv_conf="$fast"; done
      for k in 0 1 2; do wait_for_line "$k" "nodes=3" 30 || ok=false; done
      cut_at=$SECONDS
      ip -n "$hub" link set "v2b$$" down
      for k in 0 1; do expect_exit "$k" 0 30 "survivors evict the cut node and finish" || ok=false; done
      ((SECONDS - cut_at <= 10)) || { echo "FAIL [cut]: eviction took $((SECONDS - cut_at)) s"; ok=false; }
      grep -q "evict:" "$work/err.0" "$work/err.1" || { echo "FAIL [cut]: no eviction logged"; ok=false; }
      got=$(exit_code_of 2 30)
      [[ "$got" != 0 && "$got" != timeout ]] || { echo "FAIL [cut]: the cut node exited '$got'"; ok=false; }
      ;;
    host)
      WORKER='exec sleep 60'
      for k in 0 1 2; do start_agent "$k" --nnodes=3 --rdzv_conf="$fast"; done
      for k in 0 1 2; do wait_for_line "$k" "nodes=3" 30 || ok=false; done
      kill -9 "$(cat "$work/pid.0")"
      for k in 1 2; do
        expect_exit "$k" 3 15 "the host's death stops the job" || ok=false
        grep -q "$(addr 0):29400" "$work/err.$k" || { echo "FAIL [host]: message does not name the host"; ok=false; }
      done
      ;;
    many)
      # Job j runs on nodes j and j+1 (mod 4), its store on node j: each node hosts one job's
      # store and takes part in two jobs. Workers: the test worker's isolation mode.
      for j in 0 1 2 3; do
        for k in $j $(((j + 1) % 4)); do
          (
            rc=0
            ip netns exec "$tag-n$k" "$ddprun" --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \
              --rdzv_endpoint="$(addr "$j"):29400" --local_addr="$(addr "$k")" --rdzv_id="many-$j" \
              --rdzv_conf="$fast" --no_python "$bin/ddprun_test_worker" isolation "job$j" "$work/pids.$j" 20 \
              >"$work/out.$j.$k" 2>"$work/err.$j.$k" || rc=$?
            echo "$rc" >"$work/rc.$j.$k"
          ) &
        done
      done
      for j in 0 1 2 3; do
        for k in $j $(((j + 1) % 4)); do
          deadline=$((SECONDS + 90))
          until [[ -s "$work/rc.$j.$k" ]] || ((SECONDS >= deadline)); do sleep 0.05; done
          got=$(cat "$work/rc.$j.$k" 2>/dev/null || echo timeout)
          isolated=$(grep -c "^isolated rank=" "$work/out.$j.$k" || true)
          if [[ "$got" != 0 || "$isolated" != 2 ]]; then
            echo "FAIL [many]: job $j on node $k exited '$got' with $isolated ranks done"
            tail -5 "$work/err.$j.$k"
            ok=false
          fi
        done
        for pid in $(cat "$work/pids.$j" 2>/dev/null); do
          ! kill -0 "$pid" 2>/dev/null || { echo "FAIL [many]: worker $pid of job $j outlived it"; ok=false; }
        done
        count=$(wc -l <"$work/pids.$j" 2>/dev/null || echo 0)
        [[ "$count" == 4 ]] || { echo "FAIL [many]: job $j started $count workers, not 4"; ok=false; }
      done
      rm -f "$work"/pids.*
      ;;
    hang)
      # C++ workers on the runtime's host backend (test worker's collectives mode, TCP between
      # the nodes): 8 all_reduces 50 ms apart; on attempt 0 rank 1 sleeps 600 s before #5.
      WORKER="exec $bin/ddprun_test_worker collectives 8 50 1 5 600000 1"
      for k in 0 1; do start_agent "$k" --nnodes=2 --rdzv_conf="$fast" --max_restarts=1 --hang_timeout=3; done
      for k in 0 1; do expect_exit "$k" 0 90 "the job restarts after the hang and finishes" || ok=false; done
      for line in "published where this node's ranks stand" \
                  "hang: rank 1 has not called #5 (last completed all_reduce #4, " \
                  "rank 0 waits in all_reduce #5 (started " "— rank 1 is behind"; do
        grep -qF "$line" "$work"/err.* || { echo "FAIL [hang]: no '$line' in the agents' logs"; ok=false; }
      done
      done_ranks=$(cat "$work"/out.* | grep -c "^done rank=" || true)
      [[ "$done_ranks" == 2 ]] || { echo "FAIL [hang]: $done_ranks ranks finished after the restart"; ok=false; }
      left=$(find /dev/shm -maxdepth 1 -name "ddprun_flight-$scenario-*" | wc -l)
      [[ "$left" == 0 ]] || { echo "FAIL [hang]: $left flight recorder directories left on /dev/shm"; ok=false; }
      $ok || { cat "$work"/err.0 "$work"/err.1 | tail -40; }
      ;;
    *)
      echo "unknown scenario $scenario"
      exit 2
      ;;
  esac
  for ns in $(ip netns list | awk '{print $1}' | grep "^$tag-n" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  ip -n "$hub" link set "v2b$$" up
  wait 2>/dev/null || true
  if $ok; then
    echo "ok: $scenario"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  sleep 0.3
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
