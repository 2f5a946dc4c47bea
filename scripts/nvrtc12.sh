#!/usr/bin/env bash
# Fetches NVRTC 12.9 (the last NVRTC that targets compute_70, the V100) from its PyPI wheel into
# ~/.cache/nvrtc12 (or $NVRTC12_DIR) and prints the library folder. No GPU is needed.
set -euo pipefail
"$(dirname "$0")/nvrtc-wheel.sh" 12 12.9.86 "${NVRTC12_DIR:-$HOME/.cache/nvrtc12}"
