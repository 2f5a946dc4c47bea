#!/usr/bin/env bash
# The compute_70 PTX of this build (the V100 path) into folder OUT, made by
# `target/release/dustoff kernels` with NVRTC 12.9 (scripts/nvrtc12.sh; built first if missing).
#   scripts/ptx70.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/dustoff ] || cargo build --release --quiet
lib=$(scripts/nvrtc12.sh)
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" DUSTOFF_NVRTC="$lib/libnvrtc.so.12" \
  target/release/dustoff kernels --arch compute_70 --out "$1" >/dev/null
