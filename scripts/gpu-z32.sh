#!/usr/bin/env bash
# 64-row tiles of 32 tokens along z for steps of 33..=64 tokens (QTile::Rows64Z32,
# `DUSTOFF_QGEMM_Z32=N`) on the GPU, from the compute_70 PTX: gpu_parity's suites over the packed
# GEMM (scripts/gpu-parity-subset.sh), each Q4_K launch alone at 48 and 64 tokens
# (quant_kernel_breakdown, GEMM rows), then batched decode of the 8B and 30B Q4_K_M shapes at
# BATCHES (default 48,64) with the tiles from 33 tokens against without, alternating, ROUNDS (2).
# Pack on the dev VM after cargo build --release and cargo test --release --no-run:
#   bash scripts/gpu-r128.sh pack
# then on the GPU machine: bash scripts/gpu-z32.sh    (carry .gpu)
set -u
cd "$(dirname "$0")/.."
S=$HOME/st; mkdir -p $S; L=${OUT:-$S}
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -x $S/gp ] || { xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz; }
[ -x $S/dustoff ] || { xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/dustoff; }
mkdir -p /work/shared; [ -d /work/shared/testdata/arch ] || tar -C /work/shared -xJf .gpu/td.tar.xz
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
[ "${PARITY:-1}" = 1 ] && bash scripts/gpu-parity-subset.sh $L
DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_BREAKDOWN_GEMM_ONLY=1 DUSTOFF_BREAKDOWN_FORMATS=q4_k $S/gp --ignored --exact \
  quant_bench::quant_kernel_breakdown --nocapture > $L/breakdown.log 2>&1
echo "breakdown: rc $?"; grep -E '^gemm .* (48|64) tok' $L/breakdown.log | grep -v Rows128 | sed -E 's/ +/ /g; s/\[[0-9x]+\] //'
for r in $(seq 1 "${ROUNDS:-2}"); do
  for z in 0 33; do
    for shape in qwen3-8b qwen3-30b-a3b; do
      DUSTOFF_QGEMM_Z32=$z $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch ${BATCHES:-48,64} \
        --gen-tokens 100 --runs 1 --ptx-dir $S/ptx70 > $L/bench-z$z-$shape-$r.log 2>&1
      echo "Z32=$z $shape round $r: rc $? $(grep -E 'sequences:' $L/bench-z$z-$shape-$r.log | sed -E 's/ +/ /g; s/prefill [0-9.]+ s, //' | tr '\n' ';')"
    done
  done
done
