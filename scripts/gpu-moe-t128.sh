#!/usr/bin/env bash
# The grouped MoE GEMM's 128-token tile (kernels/moe_gemm_t128.cu, DUSTOFF_MOE_T128=N) on the
# GPU, from compute_70 PTX unless said: gpu_parity's GEMM suites (every tile, from PTX and
# natively), each grouped launch of the Qwen3-30B-A3B shape alone at MOE_N tokens
# (moe_kernel_breakdown: t64, w48, t128 side by side) with this commit's PTX and with BASE_PTX
# (the same kernels with another build of the tile, e.g. __launch_bounds__(256, 2)), then the
# nightly job (scripts/job-bench.sh, F16 cache) with the tile for steps whose mean expert holds
# >= T128_MEAN tokens against the default tiles, alternating for JOB_ROUNDS rounds.
#   dev VM:      cargo build --release && cargo test --release --no-run
#                BASE_PTX=<ptx70 tarball> bash scripts/gpu-moe-t128.sh pack
#   GPU machine: bash scripts/gpu-moe-t128.sh run      (carry .gpu)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-ab.sh
[ "${1:-}" = pack ] && { ab_pack_job; exit 0; }
ab_unpack
[ "${PARITY:-1}" = 1 ] && PARITY_SEL=${PARITY_SEL:-"moe_gemm quant no_cublas"} bash scripts/gpu-parity-subset.sh $L
for v in new base; do
  DUSTOFF_PTX_DIR=${PTX[$v]} MOE_BREAKDOWN_N=${MOE_N:-512,1024,2048} $S/gp --ignored --exact \
    moe_bench::moe_kernel_breakdown --nocapture > $L/moe-breakdown-$v.log 2>&1
  echo "moe breakdown ($v PTX): rc $?"; grep -E '^\| [0-9]+ \| GEMM' $L/moe-breakdown-$v.log | cut -d'|' -f2-4
done
for r in $(seq 1 "${JOB_ROUNDS:-1}"); do
  JB_KV=f16 JB_TAG=-t128-$r DUSTOFF_MOE_T128=${T128_MEAN:-64} bash scripts/job-bench.sh dustoff | grep -E "^dustoff"
  JB_KV=f16 JB_TAG=-default-$r bash scripts/job-bench.sh dustoff | grep -E "^dustoff"
done
exit 0
