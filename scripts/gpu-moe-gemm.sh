#!/usr/bin/env bash
# The grouped MoE GEMM of prefill steps on the GPU: each MoE launch alone at 1..2,048 tokens
# (moe_bench::moe_kernel_breakdown, Qwen3-30B-A3B shape, Q4_K gate/up, Q6_K down), natively and
# from the compute_70 PTX at 2,048 tokens, then Nsight Compute's view of the two GEMM launches
# at 2,048 tokens where ncu exists. Pack on the dev VM after cargo test --release --no-run:
#   scripts/gpu-route-flips.sh pack      (carry .gpu)
# then on the GPU machine: bash scripts/gpu-moe-gemm.sh
set -u
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -x $S/gp ] || { xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz; }
export DUSTOFF_REQUIRE_GPU=1
$S/gp --ignored moe_kernel_breakdown --nocapture --test-threads 1 > $S/moe-native.log 2>&1; echo "native: rc $?"
MOE_BREAKDOWN_N=768,2048 DUSTOFF_PTX_DIR=$S/ptx70 $S/gp --ignored moe_kernel_breakdown --nocapture --test-threads 1 > $S/moe-ptx.log 2>&1; echo "ptx: rc $?"
ncu=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "${ncu:-}" ] && [ "${NCU:-1}" = 1 ]; then
  MOE_BREAKDOWN_N=2048 $ncu -k regex:moe_gemm_ -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats $S/gp --ignored moe_kernel_breakdown --test-threads 1 > $S/moe-ncu.log 2>&1; echo "ncu: rc $?"
fi
cp $S/moe-*.log $OUT/ 2>/dev/null
grep -E '^\| (768|2048) \| (GEMM|whole)|tensor FLOP' $S/moe-native.log | tail -12
echo "-- from PTX"; grep -E '^\| (768|2048) \| (GEMM|whole)|tensor FLOP' $S/moe-ptx.log
