#!/usr/bin/env bash
# The packed GEMM's 128-row batch tile (kernels/gemm_quant.cu `_r128_`) on the GPU: its parity
# (gpu_parity's quant and MoE GEMM tests, from the compute_70 PTX and natively), each launch
# alone against the 64-row tiles (quant_kernel_breakdown), and batched decode with the tile
# (DUSTOFF_QGEMM_R128=17, or R128_FROM) against without it (=0), or other VARIANTS, alternating,
# ROUNDS rounds (default 2), SHAPES, from PTX; PROFILE=1 adds a per-kernel-class profile; ENV_BOTH: settings for both (e.g. DUSTOFF_QGEMM_MAX_TOKENS=128 with
# BATCHES=128: the packed GEMM instead of the widened F16 at 128 sequences).
# Pack on the dev VM after cargo build --release and cargo test --release --no-run:
#   bash scripts/gpu-r128.sh pack        (adds dustoff.xz to scripts/gpu-route-flips.sh's pack)
# then on the GPU machine: bash scripts/gpu-r128.sh run    (carry .gpu)
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  set -e; bash scripts/gpu-route-flips.sh pack >/dev/null
  strip -o /tmp/r128-dustoff target/release/dustoff; xz -6 -T2 -c /tmp/r128-dustoff > .gpu/dustoff.xz
  du -sh .gpu; exit 0
fi
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; rm -rf $S/ptx70; tar -C $S -xJf .gpu/ptx70.tar.xz
xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/dustoff
mkdir -p /work/shared; [ -d /work/shared/testdata/arch ] || tar -C /work/shared -xJf .gpu/td.tar.xz
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
# VARIANTS: "name:SETTING,SETTING ..." compared in each round (default: the 128-row tile or not;
# e.g. "c0:DUSTOFF_QGEMM_SPLIT_COST=0 c2:DUSTOFF_QGEMM_SPLIT_COST=2" for the split-K by waves).
variants=${VARIANTS:-"r64:DUSTOFF_QGEMM_R128=0 r128:DUSTOFF_QGEMM_R128=${R128_FROM:-17}"}
# SWEEP=1: each variant's Q4_K launches alone first (quant_kernel_breakdown, GEMM rows only).
if [ "${SWEEP:-0}" = 1 ]; then
  for ve in $variants; do
    v=${ve%%:*} e=$(echo "${ve#*:}" | tr ',' ' ')
    env $e DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_BREAKDOWN_GEMM_ONLY=1 DUSTOFF_BREAKDOWN_FORMATS=q4_k $S/gp --ignored --exact \
      quant_bench::quant_kernel_breakdown --nocapture > $S/sweep-$v.log 2>&1
    echo "== $v ($e): rc $?"; grep -E '^gemm ' $S/sweep-$v.log | grep -v head | sed -E 's/ +/ /g; s/\[[0-9x]+\] //; s/ GB\/s.*//'
  done
fi
# PROFILE=1: GPU time per kernel class of batched decode at PROFILE_BATCH (64) sequences, the
# default settings (DUSTOFF_PROFILE=1: graphs off, so the totals run above the graph's).
if [ "${PROFILE:-0}" = 1 ]; then
  for shape in ${SHAPES:-qwen3-8b qwen3-30b-a3b}; do
    DUSTOFF_PROFILE=1 $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch ${PROFILE_BATCH:-64} \
      --gen-tokens 100 --runs 1 --ptx-dir $S/ptx70 > $S/profile-$shape.log 2>&1
    echo "== profile $shape: rc $?"; grep -vE '^\s*$' $S/profile-$shape.log | tail -40
  done
fi
[ "${PARITY:-1}" = 1 ] && bash scripts/gpu-parity-subset.sh $S
if [ "${BREAKDOWN:-1}" = 1 ]; then
  DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_BREAKDOWN_FORMATS=q4_k,q6_k,q8_0 $S/gp --ignored --exact \
    quant_bench::quant_kernel_breakdown --nocapture > $S/breakdown.log 2>&1
  echo "breakdown (PTX): rc $?"; grep -E '^copy|^gemm ' $S/breakdown.log
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for ve in $variants; do
    v=${ve%%:*} e=$(echo "${ve#*:}" | tr ',' ' ')
    for shape in ${SHAPES:-qwen3-8b qwen3-30b-a3b}; do
      env $e ${ENV_BOTH:-} $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch ${BATCHES:-16,32,64} \
        --gen-tokens 100 --runs 1 --ptx-dir $S/ptx70 > $S/bench-$v-$shape-$r.log 2>&1
      echo "$v $shape round $r: rc $? $(grep -E 'sequences' $S/bench-$v-$shape-$r.log | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    done
  done
done
# AT128=1: 128 sequences, the default (matrices widened to F16 for cuBLAS above 64 tokens)
# against the 128-row tile along z (DUSTOFF_QGEMM_MAX_TOKENS=128).
if [ "${AT128:-0}" = 1 ]; then
  for v in widened r128; do
    e="DUSTOFF_QGEMM_R128=0"; [ $v = r128 ] && e="DUSTOFF_QGEMM_MAX_TOKENS=128 DUSTOFF_QGEMM_R128=17"
    for shape in qwen3-8b qwen3-30b-a3b; do
      env $e $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch 128 \
        --gen-tokens 100 --runs 1 --ptx-dir $S/ptx70 > $S/bench128-$v-$shape.log 2>&1
      echo "$v $shape: rc $? $(grep -E 'sequences' $S/bench128-$v-$shape.log | tr -s ' ' | tr '\n' ';' | cut -c1-200)"
    done
  done
fi
cp $S/*.log $OUT/ 2>/dev/null
