#!/usr/bin/env bash
# ddprun's wheel as a PyTorch user installs it: scripts/wheel packs this build's self-contained
# launcher, pip installs the wheel (--no-index) into a fresh venv, and then, through the venv's
# `ddprun` console script and through `python -m ddprun`, with the venv's bin/ off PATH:
#  - --version; a 2-rank job of a shell program and of a Python program (its ranks run on the
#    venv's interpreter, as torchrun's would); a failing Python job (exit 1, the report names
#    rank 1 and its exception); a bad flag (exit 2);
#  - SIGTERM to the process id the command started: it is ddprun itself (exec, not a child
#    process), stops its workers and exits 143, and it ignores the same signals as the binary
#    started directly (Python's ignored SIGPIPE is not handed on);
#  - ddprun-slurm in a SLURM job step's environment runs the packaged ddprun (--dry_run);
#  - `pip uninstall -y ddprun` leaves the venv as it was before the install, file for file.
# The wheel's binaries must need the C library alone (never the shared-linked launcher).
# Exit 77 (ctest: skipped) where Debian's python3 lacks venv, pip, setuptools or wheel.
# Usage: tests/install/wheel_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
python=/usr/bin/python3
for module in venv ensurepip pip setuptools wheel; do
  if ! "$python" -c "import $module" 2>/dev/null; then
    echo "SKIP: $python has no $module module (scripts/setup --wheel installs it)"
    exit 77
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-wheel-test-XXXXXX")
background=()
cleanup() {
  local pid
  for pid in "${background[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# No pip cache or config of the user's, no bytecode written by the interpreter itself (what pip
# compiles at install is in the wheel's RECORD, and so is removed by the uninstall).
export HOME="$work/home" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHON_EXEC PYTHON PIP_INDEX_URL PIP_FIND_LINKS
mkdir -p "$HOME"

echo "== scripts/wheel --from $build"
"$src/scripts/wheel" --from "$build" --out "$work/dist" >"$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; fail "scripts/wheel"; }
cat "$work/wheel.log"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
wheel="$work/dist/ddprun-$version-py3-none-manylinux_2_34_$(uname -m).whl"
[[ -f "$wheel" ]] || fail "no $(basename "$wheel") in $work/dist: $(ls "$work/dist")"

# What the wheel holds: the three programs, executable; the console scripts' entry points.
"$python" - "$wheel" "$work/unpacked" >"$work/contents" <<'PY' || fail "reading the wheel"
import stat, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        mode = info.external_attr >> 16
        print(f"{info.filename} {'x' if mode & stat.S_IXUSR else '-'}")
    z.extractall(sys.argv[2])
PY
for program in ddprun ddprun_store_server ddprun-slurm; do
  grep -qx "ddprun/bin/$program x" "$work/contents" || fail "the wheel has no executable ddprun/bin/$program"
  chmod +x "$work/unpacked/ddprun/bin/$program"
done
entry_points=$(cat "$work"/unpacked/ddprun-*.dist-info/entry_points.txt)
for script in "ddprun = ddprun:main" "ddprun-slurm = ddprun:slurm_main" "ddprun_store_server = ddprun:store_server_main"; do
  grep -qxF "$script" <<<"$entry_points" || fail "no console script '$script' in entry_points.txt"
done
libc_parts='libc\.so\.6|libm\.so\.6|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libutil\.so\.1|libresolv\.so\.2'
for program in ddprun ddprun_store_server; do
  needed=$(readelf -d "$work/unpacked/ddprun/bin/$program" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
  others=$(grep -Ev "^($libc_parts)\$" <<<"$needed" | tr '\n' ' ' || true)
  [[ -z "$others" ]] || fail "the wheel's $program is not self-contained: it needs $others"
  readelf -SW "$work/unpacked/ddprun/bin/$program" | grep -qE ' \.symtab | \.debug_' && fail "the wheel's $program is not stripped"
done
direct="$work/unpacked/ddprun/bin/ddprun"

echo "== a fresh venv, pip install --no-index"
venv="$work/venv"
timeout 300 "$python" -m venv "$venv" >"$work/venv.log" 2>&1 || { cat "$work/venv.log"; fail "python3 -m venv"; }
(cd "$venv" && find . | sort) >"$work/before.list"
timeout 300 "$venv/bin/python" -m pip install --no-index "$wheel" >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip install"; }
for program in ddprun ddprun-slurm ddprun_store_server; do
  [[ -x "$venv/bin/$program" ]] || fail "the install put no $program in $venv/bin"
done
packaged=$("$venv/bin/python" -c 'import ddprun; print(ddprun.program_path())')
packaged=$(readlink -f "$packaged")

# The venv's bin/ stays off PATH: the user calls its ddprun by path or through its python.
export PATH=/usr/bin:/bin
jobs="$work/jobs"
mkdir -p "$jobs"
cat >"$jobs/ranks.py" <<'PY'
import os, sys
print(f"py-worker rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} prefix={sys.prefix}", flush=True)
PY
cat >"$jobs/fails.py" <<'PY'
import os
if os.environ["RANK"] == "1":
    raise RuntimeError("wheel job: rank 1 gives up")
PY

# SIGTERM to the process the command started, once both workers run; prints its rc, its
# executable and the signals it ignores.
stop_job() {
  local out=$1 pid rc=0 i sleepers=0
  shift
  # SIGPIPE and SIGXFSZ at their defaults, whatever this test inherited, as from a login shell.
  env --default-signal=PIPE,XFSZ "$@" --standalone --nproc_per_node=2 --no_python sleep 300 >"$out.log" 2>&1 &
  pid=$!
  background+=("$pid")
  # The workers are ddprun's children; were the command a process in front of ddprun, they would
  # be its grandchildren: looked for there too, so the check below names that case.
  local parents workers
  for ((i = 0; i < 600; i++)); do
    parents=$({ pgrep -P "$pid" || true; } | tr '\n' ',')$pid
    sleepers=$(pgrep -c -P "$parents" -x sleep || true)
    ((sleepers == 2)) && break
    sleep 0.1
  done
  ((sleepers == 2)) || { cat "$out.log"; fail "$* did not start its 2 workers within 60 s"; }
  workers=$(pgrep -P "$parents" -x sleep)
  # shellcheck disable=SC2206  # pid lists
  background+=(${parents//,/ } $workers)  # the cleanup's, should a check below fail
  echo "exe=$(readlink -f "/proc/$pid/exe")" >"$out"
  grep '^SigIgn:' "/proc/$pid/status" >>"$out"
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  echo "rc=$rc" >>"$out"
  # ddprun exits after its workers: none may be left.
  for i in $workers; do
    if kill -0 "$i" 2>/dev/null; then
      cat "$out.log"
      fail "$*: worker $i still runs after ddprun exited"
    fi
  done
}

# ddprun-slurm, in a SLURM job step's environment, runs the packaged ddprun beside it.
env -i PATH=/usr/bin:/bin SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_JOB_NUM_NODES=1 SLURM_NNODES=1 SLURM_NODEID=0 \
  SLURM_JOB_NODELIST=node1 SLURM_STEP_NODELIST=node1 SLURM_TASKS_PER_NODE=2 \
  "$venv/bin/ddprun-slurm" --dry_run >"$work/slurm.out" 2>&1 || { cat "$work/slurm.out"; fail "ddprun-slurm --dry_run"; }
grep -qx -- "--rdzv_id=7" "$work/slurm.out" && grep -qx -- "--master_addr=node1" "$work/slurm.out" ||
  { cat "$work/slurm.out"; fail "ddprun-slurm did not hand SLURM's job to ddprun"; }

stop_job "$work/direct.stop" "$direct"
direct_ignored=$(grep '^SigIgn:' "$work/direct.stop")
for how in script module; do
  if [[ "$how" == script ]]; then
    launcher=("$venv/bin/ddprun")
  else
    launcher=("$venv/bin/python" -m ddprun)
  fi
  echo "== ${launcher[*]}"
  out=$("${launcher[@]}" --version) || fail "${launcher[*]} --version"
  echo "$out"
  [[ "$out" == "ddprun $version"* ]] || fail "${launcher[*]} --version printed '$out', not ddprun $version"

  timeout 60 "${launcher[@]}" --standalone --nproc_per_node=2 --no_python /bin/sh -c \
    'echo "sh-worker rank=$RANK world=$WORLD_SIZE"' >"$work/$how.sh.out" 2>&1 ||
    { cat "$work/$how.sh.out"; fail "${launcher[*]}: a 2-rank shell job"; }
  for rank in 0 1; do
    grep -q "sh-worker rank=$rank world=2" "$work/$how.sh.out" || { cat "$work/$how.sh.out"; fail "${launcher[*]}: shell rank $rank did not run"; }
  done

  timeout 60 "${launcher[@]}" --standalone --nproc_per_node=2 "$jobs/ranks.py" >"$work/$how.py.out" 2>&1 ||
    { cat "$work/$how.py.out"; fail "${launcher[*]}: a 2-rank Python job"; }
  for rank in 0 1; do
    grep -qF "py-worker rank=$rank world=2 prefix=$venv" "$work/$how.py.out" ||
      { cat "$work/$how.py.out"; fail "${launcher[*]}: Python rank $rank did not run on the venv's interpreter"; }
  done

  rc=0
  timeout 60 "${launcher[@]}" --standalone --nproc_per_node=2 "$jobs/fails.py" >"$work/$how.fail.out" 2>&1 || rc=$?
  ((rc == 1)) || { cat "$work/$how.fail.out"; fail "${launcher[*]}: the failing job exited $rc, not 1"; }
  grep -q "rank      : 1 (local_rank: 1)" "$work/$how.fail.out" || { cat "$work/$how.fail.out"; fail "${launcher[*]}: the report does not name rank 1"; }
  grep -q "RuntimeError: wheel job: rank 1 gives up" "$work/$how.fail.out" ||
    { cat "$work/$how.fail.out"; fail "${launcher[*]}: the report lacks rank 1's exception"; }

  rc=0
  "${launcher[@]}" --nproc_per_node=abc --no_python /bin/true >"$work/$how.usage.out" 2>&1 || rc=$?
  ((rc == 2)) || { cat "$work/$how.usage.out"; fail "${launcher[*]}: a bad flag exited $rc, not 2"; }

  stop_job "$work/$how.stop" "${launcher[@]}"
  cat "$work/$how.stop"
  grep -qxF "exe=$packaged" "$work/$how.stop" || fail "${launcher[*]}: the process started is not the packaged ddprun (exec)"
  grep -qx "rc=143" "$work/$how.stop" || fail "${launcher[*]}: SIGTERM did not end the job with 143 (128+15)"
  grep -qxF "$direct_ignored" "$work/$how.stop" ||
    fail "${launcher[*]}: ignores other signals than the binary started directly ($direct_ignored)"
done

echo "== pip uninstall -y ddprun"
timeout 300 "$venv/bin/python" -m pip uninstall -y ddprun >"$work/uninstall.log" 2>&1 || { cat "$work/uninstall.log"; fail "pip uninstall"; }
(cd "$venv" && find . | sort) >"$work/after.list"
if ! diff "$work/before.list" "$work/after.list"; then
  fail "pip uninstall left the venv unlike before the install (diff above: < missing, > left behind)"
fi
echo "PASS: the wheel installs into a venv, runs jobs through ddprun and python -m ddprun, and uninstalls without a trace"
