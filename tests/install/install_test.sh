#!/usr/bin/env bash
# ddprun as a user installs it: `cmake --install` into a fresh prefix, then
#  - the CMake package: an out-of-tree project finds ddprun with find_package(ddprun) and
#    links ddprun::dist/ddp/checkpoint/rpc; its binary runs under the installed ddprun
#    (2 workers) and must print the right all_reduce and all_gather results;
#  - pkg-config: ddprun-runtime (no LibTorch) and ddprun (LibTorch) each build a worker
#    that runs under the installed ddprun.
# Nothing may point back into the source or build tree.
# Usage: tests/install/install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
libdir=$(ls -d "$prefix"/lib*/cmake/ddprun | head -1)
libdir=${libdir%/cmake/ddprun}
for f in bin/ddprun bin/ddprun_store_server bin/ddprun-slurm include/ddprun/worker_runtime/distributed.h \
         include/ddprun/worker_runtime/ddp/distributed_data_parallel.h include/ddprun/common/error.h \
         include/ddprun/rendezvous/store/store.h; do
  [[ -e "$prefix/$f" ]] || fail "$f is not installed"
done
for f in cmake/ddprun/ddprunConfig.cmake cmake/ddprun/ddprunConfigVersion.cmake cmake/ddprun/ddprunTargets.cmake \
         pkgconfig/ddprun-runtime.pc pkgconfig/ddprun.pc libddprun_dist.a libddprun_ddp.a libddprun_checkpoint.a \
         libddprun_rpc.a libddprun_worker_runtime.a; do
  [[ -e "$libdir/$f" ]] || fail "$libdir/$f is not installed"
done
if grep -rlF -e "$src" -e "$build" "$libdir/cmake/ddprun" "$libdir/pkgconfig"; then
  fail "the installed package files name the source or build tree (above)"
fi
version=$("$prefix/bin/ddprun" --version)
grep -q "^ddprun [0-9]" <<<"$version" || fail "installed ddprun --version printed: $version"

run_job() {  # run_job NPROC BINARY: the workers' output, one line each
  timeout 120 "$prefix/bin/ddprun" --standalone --nproc_per_node="$1" --no_python "$2" >"$work/job.out" 2>&1 ||
    { cat "$work/job.out"; fail "ddprun job with $2 exited non-zero"; }
  cat "$work/job.out"
}
expect() {  # expect PATTERN: the last job printed a line matching it
  grep -qE "$1" "$work/job.out" || { cat "$work/job.out"; fail "no line matches '$1'"; }
}

echo "== find_package(ddprun): out-of-tree project"
cp -r "$src/tests/install/example" "$work/example"
cmake -S "$work/example" -B "$work/example/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/example.log" 2>&1 || { cat "$work/example.log"; fail "configuring the example"; }
cmake --build "$work/example/build" >>"$work/example.log" 2>&1 || { cat "$work/example.log"; fail "building the example"; }
run_job 2 "$work/example/build/allreduce_example"
expect "example rank=0 world=2 sum=3 gathered=01"
expect "example rank=1 world=2 sum=3 gathered=01"

echo "== pkg-config ddprun-runtime (no LibTorch)"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
g++ -o "$work/env_example" "$src/tests/install/pkgconfig_example/env_example.cc" \
  $(pkg-config --cflags --libs ddprun-runtime) || fail "building with pkg-config ddprun-runtime"
if ldd "$work/env_example" | grep -i torch; then fail "ddprun-runtime linked LibTorch"; fi
run_job 3 "$work/env_example"
for r in 0 1 2; do expect "pkgconfig rank=$r local_rank=$r world=3"; done

echo "== pkg-config ddprun (LibTorch)"
# shellcheck disable=SC2046
g++ -o "$work/pc_allreduce" "$src/tests/install/example/main.cc" $(pkg-config --cflags --libs ddprun) ||
  fail "building with pkg-config ddprun"
run_job 3 "$work/pc_allreduce"
for r in 0 1 2; do expect "example rank=$r world=3 sum=6 gathered=012"; done
echo "PASS: installed ddprun, find_package(ddprun) and pkg-config"
