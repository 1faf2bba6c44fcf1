# Sourced by the benchmarks whose launchers are given a fixed port (an etcd cluster's, the c10d
# port both ddprun and torchrun agents are told, a gloo port): nothing is picked and closed for
# someone else to bind later, so they run in a network namespace of their own, where no one
# else holds those ports.
#
# bench_private_netns "$0" "$@": re-runs the benchmark under scripts/in-private-netns (its
#   agents, workers and peers are its children: they share the namespace), or returns when it
#   already runs there. Where no namespace can be made it goes on in this machine's namespace,
#   saying so in one line on stderr: a port taken there fails the launcher that binds it.
bench_private_netns() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  [[ "${DDPRUN_PRIVATE_NETNS:-}" != "$(readlink /proc/self/ns/net)" ]] || return 0
  if [[ -n "${DDPRUN_PRIVATE_NETNS_UNAVAILABLE:-}" ]]; then
    echo "# $DDPRUN_PRIVATE_NETNS_UNAVAILABLE: fixed ports in this machine's namespace" >&2
    return 0
  fi
  exec "$root/scripts/in-private-netns" "$@"
}
