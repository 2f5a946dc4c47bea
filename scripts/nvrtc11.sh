#!/usr/bin/env bash
# Fetches NVRTC 11.8 (CUDA 11.8's; its file is libnvrtc.so.11.2) from its PyPI wheel into
# ~/.cache/nvrtc11 (or $NVRTC11_DIR) and prints the library file. dustoff finds it there by
# itself (or name it: DUSTOFF_NVRTC=$(scripts/nvrtc11.sh)). No GPU is needed.
set -euo pipefail
lib=$("$(dirname "$0")/nvrtc-wheel.sh" 11 11.8.89 "${NVRTC11_DIR:-$HOME/.cache/nvrtc11}")
echo "$lib/libnvrtc.so.11.2"
