#!/usr/bin/env bash
# The main loop of tensor-core kernels as the GPU runs it, without a GPU: the compute_70 PTX of
# `dustoff kernels` (NVRTC 12.9) assembled by ptxas 12.9 (the wheel scripts/ptxas-check.sh uses) for ARCH (default sm_90, the lent
# H100/H200: nvdisasm 13 no longer reads sm_70 code), disassembled by nvdisasm 13.5 (PyPI wheel
# nvidia-cuda-nvdisasm, ~5 MB, cached in ~/.cache/nvdisasm), and per kernel: the instructions
# of its main loop (first barrier to its last MMA), those of the branches a guard skips (the
# generic staging fallback), and the loop's instruction mix.
#   scripts/sass-loop.sh FILE KERNEL...     e.g. scripts/sass-loop.sh gemm_quant gemmq_q4_k_t16
# (PTX_DIR=folder: another commit's `dustoff kernels --arch compute_70` output instead.)
set -euo pipefail
cd "$(dirname "$0")/.."
file=$1; shift
arch=${ARCH:-sm_90}
nvdisasm=$(scripts/wheel-bin.sh nvidia-cuda-nvdisasm==13.5.37 nvdisasm "${NVDISASM_DIR:-$HOME/.cache/nvdisasm}")
ptxas=$(scripts/wheel-bin.sh nvidia-cuda-nvcc-cu12==12.9.86 ptxas "${PTXAS_DIR:-$HOME/.cache/ptxas}/cuda-12.9")
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
ptx=${PTX_DIR:-}  # PTX_DIR: a folder of compute_70 PTX instead of this build's
if [ -z "$ptx" ]; then
  ptx=$t/ptx
  scripts/ptx70.sh "$ptx"
fi
"$ptxas" -arch="$arch" -O3 "$ptx/$file.ptx" -o "$t/k.cubin"
"$nvdisasm" -c "$t/k.cubin" 2>/dev/null > "$t/k.sass"
python3 scripts/sass_loop.py "$t/k.sass" "$@"
