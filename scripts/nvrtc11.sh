#!/usr/bin/env bash
# Fetches NVRTC 11.8 (CUDA 11.8's; its file is libnvrtc.so.11.2) from its PyPI wheel into
# ~/.cache/nvrtc11 (or $NVRTC11_DIR) and prints the library file. dustoff finds it there by
# itself (or name it: DUSTOFF_NVRTC=$(scripts/nvrtc11.sh)). No GPU is needed.
set -euo pipefail
d=${NVRTC11_DIR:-$HOME/.cache/nvrtc11}
lib="$d/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so.11.2 >/dev/null 2>&1; then
  mkdir -p "$d"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    nvidia-cuda-nvrtc-cu11==11.8.89 -d "$d" >&2
  python3 -c 'import sys,zipfile,glob; zipfile.ZipFile(glob.glob(sys.argv[1]+"/nvidia_cuda_nvrtc_cu11-*.whl")[0]).extractall(sys.argv[1])' "$d"
fi
echo "$lib/libnvrtc.so.11.2"
