#!/usr/bin/env bash
# A kernel body changed, its entries and parameters not: this commit's compute_70 PTX against a
# base commit's under one binary, in one lease, beside llama.cpp. Three GPU calls on one warm
# machine (each under the 10-minute limit of a call):
#   prep   gpu_parity's PARITY_SEL suites from this commit's PTX, while llama.cpp builds and
#          `dustoff synth` writes the files (scripts/gpu-batched-peer.sh build)
#   bench  `bench --batch AB_NPL` (768 + 200 a sequence, F16 cache) with each PTX, alternating for
#          AB_ROUNDS rounds, then scripts/gpu-batched-peer.sh bench (the side-by-side table)
#   job    the nightly job (scripts/job-bench.sh, F16 cache) with each PTX, then the parity
#          suites natively
#   dev VM:      cargo build --release && cargo test --release --no-run
#                BASE_PTX=<the base commit's ptx70 tarball> bash scripts/gpu-ptx-ab.sh pack
#   GPU machine: bash scripts/gpu-ptx-ab.sh prep | bench | job      (carry .gpu)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-ab.sh
[ "${1:-}" = pack ] && { ab_pack_job; exit 0; }
ab_unpack
W=$HOME/jb; SHAPES=${BP_SHAPES:-"qwen3-30b-a3b qwen3-8b"}; SEL=${PARITY_SEL:-"attention kv_q8"}
case "${1:-}" in
prep)
  bash scripts/gpu-batched-peer.sh build > $L/build.log 2>&1 &
  t=$(date +%s); DUSTOFF_PTX_DIR=${PTX[new]} $S/gp --test-threads 4 $SEL > $L/ptx.log 2>&1
  echo "parity from compute_70 PTX ($SEL): rc $? $(( $(date +%s)-t )) s"
  grep -E '^test result|FAILED|panicked' $L/ptx.log | head -8
  wait; cat $L/build.log ;;
bench)
  for r in $(seq 1 "${AB_ROUNDS:-1}"); do
    for s in $SHAPES; do
      for v in base new; do
        $W/dustoff bench --model $W/$s.gguf --device cuda --ptx-dir ${PTX[$v]} --batch ${AB_NPL:-64,128} \
          --gen-tokens 200 --runs 1 --kv-cache f16 > $L/ab-$s-$v-$r.log 2>&1
        echo "$s $v round $r: rc $?"; grep -E "sequences" $L/ab-$s-$v-$r.log | tail -2
      done
    done
  done
  bash scripts/gpu-batched-peer.sh bench ;;
job)
  for v in base new; do
    JB_PTX=${PTX[$v]} JB_KV=f16 JB_TAG=-$v bash scripts/job-bench.sh dustoff | grep -E "^dustoff"
  done
  t=$(date +%s); $S/gp --test-threads 4 $SEL > $L/native.log 2>&1
  echo "parity natively ($SEL): rc $? $(( $(date +%s)-t )) s"
  grep -E '^test result|FAILED|panicked' $L/native.log | head -8 ;;
*) echo "usage: $0 pack | prep | bench | job" >&2; exit 2 ;;
esac
