#!/usr/bin/env bash
# The packed GEMMs' F16 staging (kernels/quant.cuh Stage16: Q4_K, Q6_K, Q8_0 in F16
# arithmetic, every tile) on the GPU, against the staging before it (BASE_PTX: the compute_70
# PTX of an earlier commit, same entry names), all from compute_70 PTX: each packed GEMM launch
# alone (quant_kernel_breakdown, GEMM rows only), then gpu_parity's suites over the staging
# (from PTX and natively), batched decode of the 8B and 30B Q4_K_M shapes (BASE then new,
# ROUNDS rounds), and Nsight Compute on the 8B gate/up at 16 tokens (NCU=1, new PTX).
# Pack on the dev VM after cargo build --release and cargo test --release --no-run:
#   BASE_PTX=/tmp/ptx70-base.tar.xz bash scripts/gpu-stage16.sh pack
# then on the GPU machine: bash scripts/gpu-stage16.sh run    (carry .gpu)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-ab.sh
if [ "${1:-}" = pack ]; then ab_pack; exit 0; fi
ab_unpack
if [ "${BREAKDOWN:-1}" = 1 ]; then
  for v in base new; do
    DUSTOFF_PTX_DIR=${PTX[$v]} DUSTOFF_BREAKDOWN_GEMM_ONLY=1 DUSTOFF_BREAKDOWN_FORMATS=${FORMATS:-q4_k,q6_k,q8_0} $S/gp --ignored --exact \
      quant_bench::quant_kernel_breakdown --nocapture > $L/breakdown-$v.log 2>&1
    echo "breakdown $v: rc $?"
  done
  paste <(grep -E '^gemm ' $L/breakdown-base.log | sed -E 's/ +/ /g; s/\[[0-9x]+\] //; s/ GB\/s.*//') \
        <(grep -E '^gemm ' $L/breakdown-new.log | sed -E 's/ +/ /g; s/.* tok: //; s/ GB\/s.*//') | sed 's/\t/ | new /'
fi
[ "${PARITY:-1}" = 1 ] && bash scripts/gpu-parity-subset.sh $L
for r in $(seq 1 "${ROUNDS:-1}"); do
  for v in base new; do
    for shape in ${SHAPES:-qwen3-8b qwen3-30b-a3b}; do
      $S/dustoff bench --device cuda --synthetic $shape --dtype ${DTYPE:-q4_k_m} --batch ${BATCHES:-16,32,64} \
        --gen-tokens 100 --runs 1 --ptx-dir ${PTX[$v]} > $L/bench-$v-$shape-$r.log 2>&1
      echo "$v $shape round $r: rc $? $(grep -E 'sequences' $L/bench-$v-$shape-$r.log | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    done
  done
done
ncu=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ "${NCU:-0}" = 1 ] && [ -n "$ncu" ]; then
  # quant_kernel_breakdown launches each (tokens, tile) 21 x reps (8 here) times per matrix, qkv
  # and o before gate/up: launch 337 of the entry is the gate/up's first.
  for v in ${NCU_VARIANTS:-new}; do
    DUSTOFF_PTX_DIR=${PTX[$v]} DUSTOFF_BREAKDOWN_GEMM_ONLY=1 DUSTOFF_BREAKDOWN_FORMATS=q4_k timeout 200 $ncu -k regex:'^gemmq_q4_k_t16$' \
      --launch-skip 336 -c 1 --set full $S/gp --ignored --exact quant_bench::quant_kernel_breakdown --nocapture > $L/ncu-$v.log 2>&1
    echo "== ncu gemmq_q4_k_t16 ($v): rc $?"
    grep -E 'Grid Size|Registers Per|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Achieved Occupancy|Warp Cycles Per Issued|Stall|pipe' $L/ncu-$v.log | head -30
  done
fi
exit 0
