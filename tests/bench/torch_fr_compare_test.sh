#!/usr/bin/env bash
# bench/torch_fr_compare where it cannot measure (it runs on the GPU machine): a bad argument, a
# missing ddprun, a python without torch and a torch that sees no GPU each end it with one
# line naming the culprit on stderr, nothing on stdout, and exit 2 (usage) or 1 (the machine).
# The pythons are stand-ins the test writes, so the same holds on a machine with a GPU.
# Usage: tests/bench/torch_fr_compare_test.sh BIN_DIR (where ddprun is)
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1/.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
printf '#!/bin/sh\necho 0\n' >"$dir/python_no_gpu"
printf '#!/bin/sh\necho "ModuleNotFoundError: No module named torch" >&2\nexit 1\n' >"$dir/python_no_torch"
chmod +x "$dir/python_no_gpu" "$dir/python_no_torch"

# expect CODE "LINE" ARGS...: exit CODE, stderr exactly LINE, stdout empty.
expect() {
  local code=$1 line=$2 rc=0
  shift 2
  timeout 60 "$root/bench/torch_fr_compare" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  [[ $rc -eq $code ]] || fail "$*: exit $rc, not $code ($(cat "$dir/err"))"
  [[ "$(cat "$dir/err")" == "torch_fr_compare: $line" ]] || fail "$*: stderr '$(cat "$dir/err")', not '$line'"
  [[ ! -s "$dir/out" ]] || fail "$*: printed '$(cat "$dir/out")'"
}
expect 2 "unknown argument '--bogus' (see --help)" --bogus
expect 2 "--rounds needs a value" --rounds
expect 2 "--steps 'ten' is not a whole number from 1 to 9999999" --steps ten
expect 2 "--width '0' is not a whole number from 1 to 9999999" --width 0
expect 2 "--steps 5 leaves no step after the 5 warm-up ones" --steps 5
expect 2 "--ranks '1 x': each world size is a number from 1 to 8" --ranks "1 x"
expect 1 "no $dir/nowhere/bin/ddprun (scripts/build, or scripts/gpu-build on the GPU machine)" --build "$dir/nowhere"
expect 1 "no python '$dir/absent' (--python)" --build "$build" --python "$dir/absent"
expect 1 "$dir/python_no_torch cannot import torch (--python: a python with a CUDA torch)" --build "$build" \
  --python "$dir/python_no_torch"
expect 1 "$dir/python_no_gpu's torch sees no CUDA GPU: this bench runs on the GPU machine (scripts/gpu-build --torch-fr)" \
  --build "$build" --python "$dir/python_no_gpu"
# --help says what it prints.
"$root/bench/torch_fr_compare" --help | grep -q "on_off_ratio" || fail "--help does not describe the result line"
echo ok
