#!/usr/bin/env bash
# The chaos soak (issue 36): four "hosts" in network namespaces this script creates (veth
# pairs into a bridge in a hub namespace, addresses in 10.232.0.0/24), a ddprun agent on each
# under --nnodes=2:4, and chaos_soak.py's seeded schedule of faults against them; the
# invariants are checked at the end (see chaos_soak.py). Every process and namespace it
# starts is removed when it ends, whatever happened. Nothing leaves these namespaces.
# Exit 77 (ctest: skipped) with a one-line reason where namespaces cannot be made.
# Usage: tests/chaos/chaos_soak_test.sh [-h] BIN_DIR [chaos_soak.py options: --backend c10d
#        --duration SECONDS --seed N --keep DIR --recovery restart|in-job|both]
set -euo pipefail
if [[ "${1:-}" == "-h" || $# -lt 1 ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
bin=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
for exe in ddprun chaos_trainer; do
  [[ -x "$bin/$exe" ]] || { echo "chaos: $bin/$exe is missing (build it first)"; exit 1; }
done
# Debian's python3 (only its standard library), ahead of any other on PATH.
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3) || { echo "SKIP: no python3"; exit 77; }

source "$here/../support/netns.sh"
tag="ddpc$$"
netns_require "$tag"

work=$(mktemp -d /tmp/ddprun-chaos.XXXXXX)
hub="$tag-hub"
nodes=4
driver=""
cleanup() {
  [[ -n "$driver" ]] && kill -9 "$driver" 2>/dev/null || true
  netns_remove_all "$tag"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

netns_star "$tag" "$nodes" 10.232.0 c "$$"

# The driver's cut link of node k is the hub's end of its veth, c<k>b<$$>.
"$python" "$here/chaos_soak.py" --ddprun "$bin/ddprun" --trainer "$bin/chaos_trainer" --work "$work" \
  --node-netns "$tag-n" --hub-netns "$hub" --veth-suffix "$$" --subnet 10.232.0 --nodes "$nodes" "$@" &
driver=$!
rc=0
wait "$driver" || rc=$?
driver=""
exit "$rc"
