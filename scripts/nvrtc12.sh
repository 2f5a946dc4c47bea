#!/usr/bin/env bash
# Fetches NVRTC 12.9 (the last NVRTC that targets compute_70, the V100) from its PyPI wheel into
# ~/.cache/nvrtc12 (or $NVRTC12_DIR) and prints the library folder. No GPU is needed.
set -euo pipefail
d=${NVRTC12_DIR:-$HOME/.cache/nvrtc12}
lib="$d/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so.12 >/dev/null 2>&1; then
  mkdir -p "$d"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    nvidia-cuda-nvrtc-cu12==12.9.86 -d "$d" >&2
  python3 -c 'import sys,zipfile,glob; zipfile.ZipFile(glob.glob(sys.argv[1]+"/nvidia_cuda_nvrtc_cu12-*.whl")[0]).extractall(sys.argv[1])' "$d"
fi
echo "$lib"
