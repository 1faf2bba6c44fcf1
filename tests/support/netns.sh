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
