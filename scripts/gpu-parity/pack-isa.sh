#!/usr/bin/env bash
# Packs call C (issue 34: the CUDA 11 toolchain on the GPU machine) into .gpu-c: NVRTC 11.8 from its
# PyPI wheel (libnvrtc.so.11.2 + builtins, xz), the compute_70 PTX that NVRTC 11.8 writes here
# (lowered to ISA 7.0 like NVRTC 12.9's), and c.sh. Run after pack.sh, and on the GPU machine
# after call A (c.sh uses A's ~/st: the parity binary, dustoff, the NVRTC 12.9 PTX, test data):
# bash .gpu-c/c.sh (carry .gpu-c).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu-c; mkdir -p .gpu-c
nv11=$(bash scripts/nvrtc11.sh)
tar -C "$(dirname "$nv11")" -cf - libnvrtc.so.11.2 libnvrtc-builtins.so.11.8 | xz -6 -T2 > .gpu-c/nvrtc11.tar.xz
rm -rf /tmp/ptx70-nvrtc11
DUSTOFF_NVRTC="$nv11" target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70-nvrtc11 >/dev/null
tar -C /tmp -cf - ptx70-nvrtc11 | xz -6 -T2 > .gpu-c/ptx70-nvrtc11.tar.xz
git log -1 --format='%h %s' > .gpu-c/commit
cp scripts/gpu-parity/c.sh .gpu-c/
du -sb .gpu-c
