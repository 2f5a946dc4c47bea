#!/usr/bin/env bash
# Proof without a V100 or an old driver: assembles every compute_70 PTX file with the ptxas of
# CUDA 11.8 and of CUDA 12.9 (a driver's JIT is the ptxas of its release) for -arch=sm_70, fails
# when either rejects a kernel, a kernel's shared memory exceeds a V100 SM's or a hot decode/GEMM
# kernel spills, and checks that docs/KERNELS_SM70.md (the per-kernel resource table from
# `ptxas -v`) is current.
#   scripts/ptxas-check.sh            check (CI: scripts/test.sh runs it)
#   scripts/ptxas-check.sh --write    rewrite docs/KERNELS_SM70.md
# The ptxas binaries come from the PyPI wheels nvidia-cuda-nvcc-cu11==11.8.89 and
# nvidia-cuda-nvcc-cu12==12.9.86 (~20 and ~40 MB), kept in ~/.cache/ptxas (or $PTXAS_DIR). The PTX
# is made by target/release/dustoff kernels --arch compute_70 with NVRTC 12.9 (scripts/nvrtc12.sh),
# or taken from $PTX_DIR (PTXAS_TABLE: another table file, e.g. for NVRTC 11.8's PTX). PTXAS_EXTRA_ARCHS="sm_90"
# also assembles for other architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=--check
[ "${1:-}" = "--write" ] && mode=
d=${PTXAS_DIR:-$HOME/.cache/ptxas}

# fetch SPEC NAME: the ptxas of the wheel SPEC, unpacked once into $d/NAME/ptxas.
fetch() { scripts/wheel-bin.sh "$1" ptxas "$d/$2"; }
p11=$(fetch nvidia-cuda-nvcc-cu11==11.8.89 cuda-11.8)
p12=$(fetch nvidia-cuda-nvcc-cu12==12.9.86 cuda-12.9)

ptx=${PTX_DIR:-}
if [ -z "$ptx" ]; then
  ptx=$(mktemp -d)
  trap 'rm -rf "$ptx"' EXIT
  scripts/ptx70.sh "$ptx"
fi
extra=()
for a in ${PTXAS_EXTRA_ARCHS:-}; do extra+=(--extra-arch "$a"); done
python3 scripts/ptxas_table.py $mode --ptxas "11.8=$p11" --ptxas "12.9=$p12" --ptx-dir "$ptx" \
  --out "${PTXAS_TABLE:-docs/KERNELS_SM70.md}" --cache "$d/reports" "${extra[@]}" \
  --source 'the PTX of `dustoff kernels --arch compute_70` (NVRTC 12.9.86 from scripts/nvrtc12.sh; PTX ISA 7.0)'
