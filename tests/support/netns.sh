# Network namespaces for the multi-host test scripts (sourced, not run): each script names its
# namespaces TAG-<something> and removes them all when it ends, whatever happened.

# Exits 77 (ctest: skipped) with a one-line reason where namespaces cannot be made here.
netns_require() {
  local tag=$1
  if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
    echo "SKIP: network namespaces need root and iproute2"
    exit 77
  fi
  if ! ip netns add "$tag-probe" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here"
    exit 77
  fi
  ip netns del "$tag-probe"
}

# Kills every process left in the namespaces TAG-*, then deletes them.
netns_remove_all() {
  local tag=$1 ns pid
  for ns in $(ip netns list | awk '{print $1}' | grep "^$tag-" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  sleep 0.2
  for ns in $(ip netns list | awk '{print $1}' | grep "^$tag-" || true); do ip netns del "$ns" 2>/dev/null || true; done
}

# A star of network namespaces: hub TAG-hub with bridge br0, and NODES nodes TAG-n<k>, each
# with eth0 at SUBNET.<k+1>/24, wired by a veth whose hub end is <P><k>b<SUFFIX> (P: a one-letter
# prefix, so that two scripts' veths never share a name; SUFFIX: the caller's pid).
# Usage: netns_star TAG NODES SUBNET P SUFFIX
netns_star() {
  local tag=$1 nodes=$2 subnet=$3 p=$4 suffix=$5 hub="$1-hub" k
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for k in $(seq 0 $((nodes - 1))); do
    netns_spoke "$hub" "$tag-n$k" "$subnet.$((k + 1))" "$p$k" "$suffix"
  done
}

# One more namespace NS on the star's bridge: eth0 at ADDR/24, its veth's hub end <NAME>b<SUFFIX>.
# Usage: netns_spoke HUB NS ADDR NAME SUFFIX
netns_spoke() {
  local hub=$1 ns=$2 addr=$3 name=$4 suffix=$5
  ip netns add "$ns"
  ip link add "${name}a$suffix" type veth peer name "${name}b$suffix"
  ip link set "${name}a$suffix" netns "$ns"
  ip link set "${name}b$suffix" netns "$hub"
  ip -n "$ns" link set "${name}a$suffix" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$hub" link set "${name}b$suffix" master br0
  ip -n "$hub" link set "${name}b$suffix" up
}
