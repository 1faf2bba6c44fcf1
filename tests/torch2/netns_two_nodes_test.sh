#!/usr/bin/env bash
# torch 2.6 workers under ddprun on two "hosts": network namespaces this test creates (a veth
# pair between them, addresses 10.231.1.1 and 10.231.1.2), one ddprun agent with two workers
# in each, meeting through the c10d rendezvous on the first. Nothing leaves the namespaces.
#   collectives: seed 002's collectives and gloo DDP (tests/torch2/seed002_collectives.py)
#   rpc:         torch.distributed.rpc over TensorPipe (tests/torch2/rpc_calls.py)
# Workers name their interface (GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME), as on any multi-homed host.
# Exit 77 (ctest: skipped) where namespaces cannot be made or the Debian 13 root is missing.
# Usage: tests/torch2/netns_two_nodes_test.sh [-h] BIN_DIR [SCENARIO...]
set -euo pipefail
if [[ "${1:-}" == "-h" || $# -lt 1 ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bin=$1
shift
scenarios=(collectives rpc)
[[ $# -gt 0 ]] && scenarios=("$@")
src=$(cd "$(dirname "$0")/../.." && pwd)
ddprun="$bin/ddprun"
python="$src/scripts/torch2-python"

source "$src/tests/support/netns.sh"
tag="t2n$$"
netns_require "$tag"
if ! probe=$("$src/scripts/in-torch2-root" true 2>&1); then
  echo "SKIP: $probe"
  exit 77
fi

work=$(mktemp -d)
cleanup() {
  netns_remove_all "$tag"
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$tag-n0"
ip netns add "$tag-n1"
ip link add "t2a$$" type veth peer name "t2b$$"
ip link set "t2a$$" netns "$tag-n0"
ip link set "t2b$$" netns "$tag-n1"
for k in 0 1; do
  ns="$tag-n$k"
  ip -n "$ns" link set "$([[ $k == 0 ]] && echo "t2a$$" || echo "t2b$$")" name eth0
  ip -n "$ns" addr add "10.231.1.$((k + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# Runs the scenario's script on both nodes at once, each agent bounded by `timeout`; exit
# codes to $work/rc.<node>, output to $work/out.<node> and err.<node>.
run_job() {
  local script=$1
  for k in 0 1; do
    (
      rc=0
      ip netns exec "$tag-n$k" env PYTHON="$python" GLOO_SOCKET_IFNAME=eth0 TP_SOCKET_IFNAME=eth0 \
        timeout -k 5 180 "$ddprun" --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \
        --rdzv_endpoint=10.231.1.1:29400 --local_addr="10.231.1.$((k + 1))" --rdzv_id="$scenario-$$" \
        "$src/tests/torch2/$script" >"$work/out.$k" 2>"$work/err.$k" || rc=$?
      echo "$rc" >"$work/rc.$k"
    ) &
  done
  wait
}
fail() {
  echo "FAIL [$scenario]: $*"
  ok=false
}
show_nodes() {
  for k in 0 1; do
    echo "--- namespace n$k: exit $(cat "$work/rc.$k" 2>/dev/null), stdout:"
    cat "$work/out.$k" 2>/dev/null || true
    echo "--- namespace n$k: stderr (last 30 lines):"
    tail -30 "$work/err.$k" 2>/dev/null || true
  done
}
# Each of the four ranks printed "rank R/4 (node G)$1" exactly once, from the agent of group
# rank G = R / 2 (two workers per node; group ranks follow the order of arrival, so either
# namespace may be node 0, but not both).
expect_ranks() {
  local r g line where
  local -A node_of_namespace=()
  for r in 0 1 2 3; do
    g=$((r / 2))
    line="rank $r/4 (node $g)$1"
    where=$(grep -lxF "$line" "$work/out.0" "$work/out.1" || true)
    if [[ $(echo "$where" | grep -c . || true) != 1 || $(grep -cxF "$line" $where) != 1 ]]; then
      fail "'$line' not printed exactly once"
      continue
    fi
    node_of_namespace[$where]+=" $g"
  done
  local nodes="${node_of_namespace[$work/out.0]:-} |${node_of_namespace[$work/out.1]:-}"
  [[ "$nodes" == " 0 0 | 1 1" || "$nodes" == " 1 1 | 0 0" ]] ||
    fail "group ranks by namespace: '$nodes', not one node (two ranks) in each"
}

passed=0
failed=0
for scenario in "${scenarios[@]}"; do
  rm -f "$work"/out.* "$work"/err.* "$work"/rc.*
  ok=true
  case "$scenario" in
    collectives)
      run_job seed002_collectives.py
      for k in 0 1; do [[ $(cat "$work/rc.$k") == 0 ]] || fail "node $k exited $(cat "$work/rc.$k")"; done
      $ok && expect_ranks ": seed 002 collectives and DDP ok"
      ;;
    rpc)
      run_job rpc_calls.py
      for k in 0 1; do [[ $(cat "$work/rc.$k") == 0 ]] || fail "node $k exited $(cat "$work/rc.$k")"; done
      $ok && expect_ranks ": rpc ok"
      ;;
    *)
      echo "unknown scenario $scenario"
      exit 2
      ;;
  esac
  for ns in "$tag-n0" "$tag-n1"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  $ok || show_nodes
  if $ok; then
    echo "ok: $scenario"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
