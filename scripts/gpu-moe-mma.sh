#!/usr/bin/env bash
# The grouped MoE GEMM's register-fragment tiles (kernels/moe_gemm_mma.cu, r8 / r16:
# DUSTOFF_MOE_MMA=1) on the GPU, all from compute_70 PTX unless said: gpu_parity's suites over
# the GEMMs (every tile, from PTX and natively), each grouped launch of the Qwen3-30B-A3B shape
# alone at MOE_N tokens (moe_kernel_breakdown: t8, t16, r8, r16 side by side), then batched
# decode (`bench --batch`) of the VARIANTS, ROUNDS rounds alternating: base (BASE_PTX, an
# earlier commit's compute_70 PTX: the staging before this change), new (this commit, defaults),
# mma (DUSTOFF_MOE_MMA=1), mma16 (the 16-token register tile at every decode size). A variant's
# words that start with -- are bench flags (e.g. "q8:--kv-cache=q8"), the others environment.
# Pack on the dev VM after cargo build --release and cargo test --release --no-run:
#   BASE_PTX=/tmp/ptx70-base.tar.xz bash scripts/gpu-moe-mma.sh pack
# then on the GPU machine: bash scripts/gpu-moe-mma.sh run    (carry .gpu)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-ab.sh
if [ "${1:-}" = pack ]; then ab_pack; exit 0; fi
ab_unpack
[ "${PARITY:-1}" = 1 ] && bash scripts/gpu-parity-subset.sh $L
if [ "${BREAKDOWN:-1}" = 1 ]; then
  DUSTOFF_PTX_DIR=$S/ptx70 MOE_BREAKDOWN_N=${MOE_N:-32,64,128} $S/gp --ignored --exact \
    moe_bench::moe_kernel_breakdown --nocapture > $L/moe-breakdown.log 2>&1
  echo "moe breakdown (PTX): rc $?"; grep -E '^\| [0-9]+ \| GEMM' $L/moe-breakdown.log | cut -d'|' -f2-5
fi
# PROFILE="NAME:WORDS ...": GPU time per kernel class of batched decode at PROFILE_BATCH (64)
# sequences for each SHAPES, words as in VARIANTS (DUSTOFF_PROFILE=1: graphs off).
for ve in ${PROFILE:-}; do
  v=${ve%%:*} w=$(echo "${ve#*:}" | tr ',' ' ')
  for shape in ${SHAPES:-qwen3-30b-a3b}; do
    env DUSTOFF_PROFILE=1 $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch ${PROFILE_BATCH:-64} \
      --gen-tokens 100 --runs 1 --ptx-dir $S/ptx70 $w > $L/profile-$v-$shape.log 2>&1
    echo "== profile $v $shape: rc $?"; grep -vE '^\s*$' $L/profile-$v-$shape.log | tail -${PROFILE_LINES:-16}
  done
done
variants=${VARIANTS:-"base new mma:DUSTOFF_MOE_MMA=1 mma16:DUSTOFF_MOE_MMA=1,DUSTOFF_MOE_T8=0"}
for r in $(seq 1 "${ROUNDS:-1}"); do
  for ve in $variants; do
    v=${ve%%:*} e=""; [ "$v" != "$ve" ] && e=$(echo "${ve#*:}" | tr ',' ' ')
    a=$(for w in $e; do case $w in --*) echo -n "$w ";; esac; done); e=$(for w in $e; do case $w in --*) ;; *) echo -n "$w ";; esac; done)
    dir=${PTX[${v%%-*}]:-$S/ptx70}  # base-q8: the base PTX
    for shape in ${SHAPES:-qwen3-30b-a3b}; do
      env $e $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch ${BATCHES:-32,64,128} \
        --gen-tokens 100 --runs 1 --ptx-dir $dir $a > $L/bench-$v-$shape-$r.log 2>&1
      echo "$v $shape round $r: rc $? $(grep -E 'sequences' $L/bench-$v-$shape-$r.log | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
    done
  done
done
exit 0
