#!/usr/bin/env bash
# Nsight Compute's view of the packed GEMM's 64-row tiles (kernels/gemm_quant.cu
# `gemmq_q4_k_t16` / `_t64`) on the Qwen3-8B gate/up matrix ([24576 x 4096] Q4_K) at 16 and 64
# tokens, from the compute_70 PTX: which pipe or stall bounds the batched decode's largest
# product. quant_kernel_breakdown launches each (tokens, tile) 21 x 8 times per matrix, qkv and
# o before gate/up, so the gate/up's first launch of each entry is number 337 (grid printed to
# check). Pack on the dev VM after cargo test --release --no-run:
#   bash scripts/gpu-route-flips.sh pack      (carry .gpu)
# then on the GPU machine: bash scripts/gpu-qgemm-ncu.sh   (PARITY=1 then runs
# scripts/gpu-parity-full.sh with NATIVE=all in the same call)
set -u
cd "$(dirname "$0")/.."
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -x $S/gp ] || { xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz; }
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
ncu=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
for e in t16 t64; do
  DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_BREAKDOWN_FORMATS=q4_k timeout 240 $ncu -k regex:"^gemmq_q4_k_${e}\$" \
    --launch-skip 336 -c 1 --set full $S/gp --ignored --exact quant_bench::quant_kernel_breakdown \
    --nocapture > $S/ncu-$e.log 2>&1
  echo "== ncu gemmq_q4_k_$e: rc $?"
  grep -E 'gemmq_q4_k|Grid Size|Registers Per|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc Active|Executed Ipc Active|No Eligible|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|L1/TEX Hit|Shared Memory|Bank' $S/ncu-$e.log | grep -v '^gemm ' | head -40
done
cp $S/ncu-*.log $OUT/ 2>/dev/null
[ "${PARITY:-0}" = 1 ] && NATIVE=all bash scripts/gpu-parity-full.sh
exit 0
