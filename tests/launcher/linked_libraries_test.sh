#!/usr/bin/env bash
# The shared libraries a binary loads, checked against the only ones it may: each NEEDED
# entry (readelf) and everything the loader resolves for it (ldd) must match ALLOWED, an
# extended regular expression over library file names. ddprun must start in milliseconds
# on hosts without LibTorch, CUDA or NCCL, so it may load only the C library (the
# self-contained launcher) or also the C++ runtime, fmt, spdlog and OpenSSL
# (tests/launcher/CMakeLists.txt). Fails when it cannot check: no readelf or ldd, no NEEDED
# entries (a static binary), a library that does not resolve.
# Usage: tests/launcher/linked_libraries_test.sh BINARY ALLOWED [--expect-violation]
#   --expect-violation: succeed only if some library is not allowed (the check's own test).
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 || "${1:-}" == -h ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
binary=$1
allowed=$2
expect_violation=false
[[ "${3:-}" == --expect-violation ]] && expect_violation=true
fail() { echo "FAIL: $*" >&2; exit 1; }

command -v readelf >/dev/null || fail "readelf is missing: cannot check $binary"
command -v ldd >/dev/null || fail "ldd is missing: cannot check $binary"
[[ -x "$binary" ]] || fail "$binary is not an executable"

needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p') || fail "readelf -d $binary failed"
[[ -n "$needed" ]] || fail "$binary has no NEEDED entries (static?): cannot check"
resolved=$(ldd "$binary") || fail "ldd $binary failed"
if grep -q 'not found' <<<"$resolved"; then
  fail "$binary has libraries that do not resolve:"$'\n'"$(grep 'not found' <<<"$resolved")"
fi
# The file name of each library the loader maps ("libfmt.so.9 => /lib/.../libfmt.so.9 (0x..)",
# "/lib64/ld-linux-x86-64.so.2 (0x..)", "linux-vdso.so.1 (0x..)").
loaded=$(awk '{print $1}' <<<"$resolved" | sed 's|.*/||')
[[ -n "$loaded" ]] || fail "ldd $binary listed nothing: cannot check"

violations=$(printf '%s\n%s\n' "$needed" "$loaded" | sort -u | grep -Ev "^($allowed)\$" || true)
# A few names are enough to act on; LibTorch brings hundreds.
summary() {
  local n
  n=$(wc -l <<<"$1")
  echo "$n ($(head -n 12 <<<"$1" | tr '\n' ' ' | sed 's/ $//')$( ((n > 12)) && echo ' ...'))"
}
echo "$binary: NEEDED $(tr '\n' ' ' <<<"$needed")"
echo "$binary: loads $(summary "$loaded")"
if $expect_violation; then
  [[ -n "$violations" ]] || fail "no library outside '$allowed' found, though one was expected"
  echo "ok: not allowed, as expected: $(summary "$violations")"
  exit 0
fi
[[ -z "$violations" ]] || fail "$binary loads libraries outside '$allowed': $(summary "$violations")"
echo "ok: all $(wc -l <<<"$loaded") libraries are allowed"
