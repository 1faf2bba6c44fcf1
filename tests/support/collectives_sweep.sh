# For the bench/collectives_sweep test scripts (sourced, not run): `root` (the source tree),
# `dir` (a scratch directory removed when the script ends), DDPRUN_BIN_DIR from the script's
# first argument (where ddprun and collectives_sweep_ddprun are), fail() and
# sweep_rejects().

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export DDPRUN_BIN_DIR="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# sweep_rejects TEXT ARG...: the sweep run with ARG... exits 2 with one line, which holds TEXT.
sweep_rejects() {
  local text=$1 rc=0
  shift
  "$root/bench/collectives_sweep" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -eq 2 ]] || fail "$*: exit $rc, not 2"
  if [[ $(wc -l <"$dir/err") -ne 1 ]] || ! grep -q "$text" "$dir/err"; then
    fail "$*: $(cat "$dir/err")"
  fi
}
