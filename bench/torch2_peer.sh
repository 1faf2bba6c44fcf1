# Sourced by the benchmarks that measure torch 2.6 as a second peer, in the same run, next to
# Debian 12's torch 1.13. torch 2.6 is Debian 13's, in the root that scripts/setup-torch2 makes;
# scripts/torch2-python runs its python3 there (same PID, environment, network, /tmp and
# /dev/shm as here), and `-m torch.distributed.run` is its torchrun.
#
# torch2_check NAME: sets torch2_python (that interpreter) when torch 2.6 can be imported, else
#   leaves it empty, sets torch2_reason and prints "# NAME: torch 2.6 peer not run: REASON".
#   DDPRUN_BENCH_TORCH2=0 skips the peer. Never fails: without torch 2.6 a benchmark reports
#   torch 1.13 alone.
# torch2_in DIR CMD...: runs CMD with DIR as its current directory. Inside the root only the
#   clone, /tmp and the current directory are visible, so a peer program outside the clone
#   (../shared/anchors) is run from its own directory.
# torch2_torchrun ARGS...: torchrun 2.6 with ARGS.
torch2_python=""
torch2_reason=""

torch2_check() {
  local name=$1 here err
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [[ "${DDPRUN_BENCH_TORCH2:-1}" == "0" ]]; then
    torch2_reason="DDPRUN_BENCH_TORCH2=0"
  elif ! err=$(timeout 120 "$here/scripts/torch2-python" -c 'import torch.distributed' 2>&1 >/dev/null); then
    torch2_reason=$(printf '%s\n' "$err" | grep -v '^\s*$' | tail -1)
    [[ -n "$torch2_reason" ]] || torch2_reason="scripts/torch2-python failed"
  else
    torch2_python="$here/scripts/torch2-python"
    return 0
  fi
  echo "# $name: torch 2.6 peer not run: $torch2_reason"
}

torch2_in() {
  local dir=$1
  shift
  (cd "$dir" && "$@")
}

torch2_torchrun() {
  "$torch2_python" -m torch.distributed.run "$@"
}
