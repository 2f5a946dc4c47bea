#!/usr/bin/env bash
# Builds the release binary for old Linux: linked against glibc 2.17 (CentOS/RHEL 7 and every
# newer distribution) with cargo-zigbuild and zig, both from PyPI (pinned below, installed into
# ~/.cache/dustoff-zig or $DUSTOFF_ZIG_DIR), then checks that the highest GLIBC_ symbol version
# the binary needs is <= 2.17 and fails otherwise. The binary links $ORIGIN/lib as a library
# folder, so an offline bundle's lib/ (cuBLAS, scripts/bundle.sh) is found without LD_LIBRARY_PATH.
#
#   scripts/release.sh [--profile NAME]   build (default profile: release); last line: the binary
#   scripts/release.sh --check FILE       only the glibc check of FILE
set -euo pipefail
cd "$(dirname "$0")/.."

GLIBC_MAX=2.17
ZIG_VERSION=0.17.1          # PyPI ziglang
ZIGBUILD_VERSION=0.24.1     # PyPI cargo-zigbuild (a prebuilt binary)
TARGET=x86_64-unknown-linux-gnu

# The highest GLIBC_x.y symbol version FILE needs (its dynamic symbol table).
glibc_needed() {
  command -v objdump >/dev/null || { echo "objdump not found (install binutils)" >&2; return 1; }
  objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -V | tail -n 1
}

# Fails unless FILE needs glibc <= GLIBC_MAX.
check() {
  local need
  need=$(glibc_needed "$1")
  [ -n "$need" ] || { echo "$1: no GLIBC_ symbol versions found (not a dynamic glibc binary?)" >&2; return 1; }
  if [ "$(printf '%s\n%s\n' "$need" "$GLIBC_MAX" | sort -V | tail -n 1)" != "$GLIBC_MAX" ]; then
    echo "$1 needs glibc $need, newer than $GLIBC_MAX: it would not start on CentOS/RHEL 7 (2.17) or RHEL 8 (2.28)" >&2
    objdump -T "$1" | grep -F "GLIBC_$need" | sed 's/^/  /' >&2
    return 1
  fi
  echo "$1: highest glibc symbol version GLIBC_$need (<= $GLIBC_MAX)"
}

if [ "${1:-}" = "--check" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --check FILE" >&2; exit 2; }
  check "$2"
  exit
fi
profile=release
if [ "${1:-}" = "--profile" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 [--profile NAME]" >&2; exit 2; }
  profile=$2
elif [ $# -ne 0 ]; then
  echo "usage: $0 [--profile NAME] | --check FILE" >&2
  exit 2
fi

tools=${DUSTOFF_ZIG_DIR:-$HOME/.cache/dustoff-zig}
if ! "$tools/bin/cargo-zigbuild" --version 2>/dev/null | grep -qF "$ZIGBUILD_VERSION" \
  || ! "$tools/ziglang/zig" version 2>/dev/null | grep -qxF "$ZIG_VERSION"; then
  rm -rf "$tools"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --target "$tools" "ziglang==$ZIG_VERSION" "cargo-zigbuild==$ZIGBUILD_VERSION" >&2
fi
export PATH="$tools/bin:$tools/ziglang:$PATH"

# $ORIGIN/lib: the bundle's library folder (dlopen of cuBLAS by name searches the binary's
# RUNPATH after LD_LIBRARY_PATH). Only for the target, not build scripts (cargo with --target).
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-rpath,\$ORIGIN/lib"
cargo zigbuild --profile "$profile" --bin dustoff --target "$TARGET.$GLIBC_MAX" >&2
dir=$profile
[ "$profile" = dev ] && dir=debug
bin="target/$TARGET/$dir/dustoff"
check "$bin" >&2
echo "$bin"
