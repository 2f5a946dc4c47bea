#!/usr/bin/env bash
# Fetches NVRTC from its PyPI wheel (no GPU, no CUDA toolkit) into a cache folder and prints its
# library folder. Usage: scripts/nvrtc-wheel.sh MAJOR VERSION DIR   (MAJOR 11 or 12; VERSION the
# wheel's, e.g. 12.9.86; DIR the cache folder). scripts/nvrtc11.sh and nvrtc12.sh name the two
# the project uses.
set -euo pipefail
major=$1 version=$2 d=$3
lib="$d/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so.* >/dev/null 2>&1; then
  mkdir -p "$d"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    "nvidia-cuda-nvrtc-cu$major==$version" -d "$d" >&2
  python3 -c 'import sys,zipfile,glob; zipfile.ZipFile(glob.glob(sys.argv[1]+"/nvidia_cuda_nvrtc_cu*.whl")[0]).extractall(sys.argv[1])' "$d"
fi
echo "$lib"
