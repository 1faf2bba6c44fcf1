#!/usr/bin/env bash
# The launcher's Debian package on a machine that has never seen ddprun, LibTorch or our
# build tree: cpack -G DEB builds ddprun_*.deb and libddprun-dev_*.deb; the launcher's
# Depends must name no torch package; a copy of a clean Debian 12 root (debootstrap minbase,
# cached by scripts/setup-debian-root) installs it with apt from its Depends alone, then
# runs a two-worker job and a failing job there, through chroot in a private mount namespace.
# Exit 77 (ctest: skipped) with the reason where no such root can be made (not root, no
# debootstrap, no registry).
# Usage: tests/install/deb_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
if [[ $# -ne 2 ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ $(id -u) -ne 0 ]]; then echo "SKIP: a Debian root and chroot need root"; exit 77; fi
if ! base=$("$src/scripts/setup-debian-root" bookworm 2>"${TMPDIR:-/tmp}/ddprun-root-$$.err"); then
  echo "SKIP: no clean Debian root: $(tail -1 "${TMPDIR:-/tmp}/ddprun-root-$$.err")"
  rm -f "${TMPDIR:-/tmp}/ddprun-root-$$.err"
  exit 77
fi
rm -f "${TMPDIR:-/tmp}/ddprun-root-$$.err"
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-deb-XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/packages" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack"; }
launcher_deb=$(ls "$work"/packages/ddprun_*.deb)
dev_deb=$(ls "$work"/packages/libddprun-dev_*.deb)
depends=$(dpkg-deb -f "$launcher_deb" Depends)
echo "ddprun Depends: $depends"
[[ -n "$depends" ]] || fail "the launcher package has no Depends (dpkg-shlibdeps did not run)"
grep -qi torch <<<"$depends" && fail "the launcher package depends on LibTorch: $depends"
# The self-contained launcher (cmake/SelfContained.cmake) needs the C library alone.
[[ "$depends" =~ ^libc6(\ \(\>=\ [0-9.]+\))?$ ]] || fail "the launcher package depends on more than libc6: $depends"
# Listings are read whole (grep -q would close the pipe early under pipefail).
dpkg-deb -c "$launcher_deb" >"$work/launcher.list"
dpkg-deb -c "$dev_deb" >"$work/dev.list"
grep -q "/usr/bin/ddprun$" "$work/launcher.list" || fail "ddprun_*.deb has no /usr/bin/ddprun"
grep -q "ddprunConfig.cmake$" "$work/dev.list" || fail "libddprun-dev has no CMake package"
grep -q "include/ddprun/worker_runtime/distributed.h$" "$work/dev.list" || fail "libddprun-dev has no headers"
dpkg-deb -f "$dev_deb" Depends | grep -q "libtorch-dev" || fail "libddprun-dev does not depend on libtorch-dev"

# The launcher's dependencies are fetched into the cached root's apt archive once (the only
# network use); the copy below then installs with --no-download.
echo "== preparing the root's package cache"
cp /etc/hosts "$base/etc/hosts"
cp "$launcher_deb" "$base/tmp/ddprun.deb"
if ! timeout 600 chroot "$base" apt-get -qq update >"$work/apt.log" 2>&1 &&
   ! ls "$base"/var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
  echo "SKIP: the Debian root cannot reach Debian's registry: $(tail -1 "$work/apt.log")"
  exit 77
fi
timeout 600 chroot "$base" apt-get -qq install --download-only -y /tmp/ddprun.deb >>"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; fail "fetching the launcher's dependencies into the root"; }
rm -f "$base/tmp/ddprun.deb"

echo "== a copy of the clean root installs ddprun_*.deb"
root="$work/root"
cp -a "$base" "$root"
if ls "$root"/usr/lib/*/libtorch* >/dev/null 2>&1 || [[ -e "$root$src" || -e "$root$build" ]]; then
  fail "the clean root is not clean (LibTorch or our tree is in it)"
fi
cp "$launcher_deb" "$root/tmp/ddprun.deb"
cat >"$root/tmp/job.sh" <<'JOB'
set -eu
# dpkg unpacks it and stops on the missing Depends; apt then installs exactly those, from the
# cached archives (apt's --no-download refuses a local .deb path itself).
dpkg -i /tmp/ddprun.deb >/tmp/install.log 2>&1 || true
apt-get -qq install -f -y --no-download >>/tmp/install.log 2>&1 || { cat /tmp/install.log; exit 10; }
dpkg-query -W -f='${Status}\n' ddprun | grep -q "install ok installed" || { cat /tmp/install.log; exit 12; }
if ldd /usr/bin/ddprun | grep -E "not found|torch"; then exit 11; fi
ddprun --version
timeout 60 ddprun --standalone --nproc_per_node=2 --no_python /bin/sh -c 'echo "deb-worker rank=$RANK world=$WORLD_SIZE"'
set +e
timeout 60 ddprun --standalone --nproc_per_node=2 --no_python /bin/sh -c 'exit 3' 2>/tmp/fail.err
echo "failing job rc=$?"
grep -c "exit      : exit code 3" /tmp/fail.err | sed 's/^/failure report lines: /'
JOB
# proc and dev live only in this private mount namespace: nothing to unmount afterwards.
timeout 300 unshare --mount --fork sh -c "mount -t proc proc '$root/proc' && mount --rbind /dev '$root/dev' &&
  chroot '$root' /bin/sh /tmp/job.sh" >"$work/job.out" 2>&1 || { cat "$work/job.out"; fail "the job in the root"; }
cat "$work/job.out"
grep -q "^ddprun [0-9]" "$work/job.out" || fail "ddprun --version in the root"
grep -q "deb-worker rank=0 world=2" "$work/job.out" || fail "rank 0 did not run"
grep -q "deb-worker rank=1 world=2" "$work/job.out" || fail "rank 1 did not run"
grep -q "failing job rc=[1-9]" "$work/job.out" || fail "a failing job exited 0"
grep -q "failure report lines: [1-9]" "$work/job.out" || fail "no failure report for the failing job"
echo "PASS: ddprun_*.deb installs from its Depends and runs jobs in a clean Debian root"
