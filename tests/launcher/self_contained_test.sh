#!/usr/bin/env bash
# The self-contained launcher as a user installs it (`cmake --install BUILD_DIR --component
# launcher` into a fresh prefix), read from its ELF files with readelf:
#  --needed:     ddprun and ddprun_store_server need only the C library's own parts (NEEDED:
#                libc, libm, the loader, and glibc's split-off libpthread, libdl, librt, libutil,
#                libresolv), nothing of libstdc++, libgcc_s, spdlog, fmt or OpenSSL; both are
#                stripped (no symbol table, no debug sections) and start with every symbol bound.
#  --glibc MAX:  no versioned symbol they reference needs a glibc newer than MAX (GLIBC_x.y from
#                readelf -V's version needs). That holds for builds made on glibc 2.36 or older
#                (Debian 12); on a newer build host it cannot, and the check exits 77 (skipped).
# Usage: tests/launcher/self_contained_test.sh BUILD_DIR --needed | --glibc MAX
set -euo pipefail
if [[ $# -lt 2 || "${1:-}" == -h ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
build=$1
mode=$2
max=${3:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ "$mode" == --needed || ("$mode" == --glibc && "$max" =~ ^[0-9]+\.[0-9]+$) ]] ||
  fail "expected --needed or --glibc MAJOR.MINOR, got: ${*:2}"
command -v readelf >/dev/null || fail "readelf is missing: cannot check the launcher"

# "2.36" from "glibc 2.36"; the newest glibc a GLIBC_2.34-bounded binary can be built on is
# Debian 12's, whose libstdc++.a and libgcc_eh.a are the ones glibc_compat.cc answers for.
newer() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" == "$1" && "$1" != "$2" ]]; }
if [[ "$mode" == --glibc ]]; then
  host=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  if newer "$host" 2.36; then
    echo "SKIP: built against glibc $host; the GLIBC_$max bound holds for builds on glibc 2.36 (Debian 12) or older"
    exit 77
  fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-self-contained-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --component launcher --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install $build --component launcher"; }

libc_parts='libc\.so\.6|libm\.so\.6|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libutil\.so\.1|libresolv\.so\.2'
status=0
for program in ddprun ddprun_store_server; do
  binary="$work/prefix/bin/$program"
  [[ -x "$binary" ]] || fail "$program is not installed as an executable"
  dynamic=$(readelf -d "$binary") || fail "readelf -d $program failed"
  needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' <<<"$dynamic")
  [[ -n "$needed" ]] || fail "$program has no NEEDED entries: not a dynamically linked glibc program"
  size=$(stat -c %s "$binary")
  if [[ "$mode" == --needed ]]; then
    echo "$program ($size bytes): NEEDED $(tr '\n' ' ' <<<"$needed")"
    others=$(grep -Ev "^($libc_parts)\$" <<<"$needed" || true)
    if [[ -n "$others" ]]; then
      echo "FAIL: $program needs libraries besides the C library: $(tr '\n' ' ' <<<"$others")" >&2
      status=1
    fi
    sections=$(readelf -SW "$binary" | sed -n 's/^ *\[ *[0-9]*\] \([^ ]*\) .*/\1/p')
    unstripped=$(grep -E '^(\.symtab|\.debug_.*)$' <<<"$sections" || true)
    if [[ -n "$unstripped" ]]; then
      echo "FAIL: $program is installed unstripped: $(tr '\n' ' ' <<<"$unstripped")" >&2
      status=1
    fi
    # Every symbol bound at start (LD_BIND_NOW): the loader accepts it here. ddprun prints its
    # version; the store server, which has no such flag, refuses it with its usage (exit 2).
    expected=0 args=(--version)
    [[ "$program" == ddprun_store_server ]] && expected=2 args=(--no-such-flag)
    rc=0
    LD_BIND_NOW=1 "$binary" "${args[@]}" >"$work/run.out" 2>&1 || rc=$?
    if ((rc != expected)); then
      cat "$work/run.out"
      echo "FAIL: the installed $program ${args[*]} exited $rc, not $expected" >&2
      status=1
    fi
  else
    # Version needs, per file: "File: libc.so.6 ..." then "Name: GLIBC_2.34 ...".
    versions=$(readelf -VW "$binary" | sed -n 's/.*Name: \(GLIBC_[0-9.]*\).*/\1/p' | sort -uV)
    [[ -n "$versions" ]] || fail "$program references no GLIBC_ symbol versions: cannot check"
    highest=$(tail -1 <<<"$versions")
    echo "$program: highest glibc symbol version $highest"
    too_new=$(while read -r v; do if newer "${v#GLIBC_}" "$max"; then echo "$v"; fi; done <<<"$versions")
    if [[ -n "$too_new" ]]; then
      pattern=$(tr '\n' '|' <<<"$too_new" | sed 's/|$//; s/\./\\./g')
      symbols=$(readelf -sW --dyn-syms "$binary" | grep -oE "[A-Za-z0-9_.]+@($pattern)\b" | sort -u | tr '\n' ' ')
      echo "FAIL: $program needs glibc newer than $max: $(tr '\n' ' ' <<<"$too_new")(symbols: $symbols)" >&2
      status=1
    fi
  fi
done
((status == 0)) || exit 1
echo "ok: the installed launcher is self-contained ($mode${max:+ $max})"
