#!/usr/bin/env bash
# The MoE prefill kernels (issue 29 item 1) on the GPU: the tiled router logits and the grouped
# GEMM that skips a tile's empty 16-token fragments, each A/B against the kernels before them
# (new: DUSTOFF_ROUTER_TILED=1 DUSTOFF_MOE_GEMM_SKIP=1; old: both off) in the same lease, all from the compute_70
# PTX: gpu_parity's MoE tests (natively and from the PTX), the per-launch breakdown at 1..768
# tokens, one-stream prefill + decode of the Qwen3-30B-A3B shape, and the nightly job
# (scripts/job-bench.sh) at the default and a 2,048-token step budget.
#   dev VM:      cargo build --release && cargo test --release --no-run --test gpu_parity
#                JB_RECORDS=600 bash scripts/gpu-moe-prefill.sh pack     (writes .gpu/)
#   GPU machine: bash scripts/gpu-moe-prefill.sh run                     (carry .gpu)
# GMP_SKIP="parity breakdown bench job profile" leaves parts out; GMP_NEW sets the switches of
# the new kernels (both by default), GMP_JOBS the job runs ("new b2048 old").
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  set -e
  bash scripts/job-bench.sh pack
  gp=$(ls -t target/release/deps/gpu_parity-* | grep -v '\.d$' | head -1)
  strip -o /tmp/gp "$gp"; xz -6 -T2 -c /tmp/gp > .gpu/gp.xz
  du -sh .gpu; exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 pack | run" >&2; exit 2; }
S=$HOME/gmp; mkdir -p $S; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
skip() { case " ${GMP_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/gp $S/dustoff
tar -C $S -xJf .gpu/ptx70.tar.xz
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
NEW=${GMP_NEW:-"DUSTOFF_ROUTER_TILED=1 DUSTOFF_MOE_GEMM_SKIP=1"}; OLD="DUSTOFF_ROUTER_TILED=0 DUSTOFF_MOE_GEMM_SKIP=0"

if ! skip parity; then
  for mode in native ptx70; do
    envs=$([ $mode = ptx70 ] && echo DUSTOFF_PTX_DIR=$S/ptx70 || echo X=1)
    t=$(date +%s); env $envs $NEW $S/gp moe --test-threads 4 > $S/parity-$mode.log 2>&1
    echo "gpu_parity moe ($mode): rc $? in $(( $(date +%s)-t )) s"
    grep -E '^test result|FAILED|panicked' $S/parity-$mode.log | head -8
  done
fi

if ! skip breakdown; then
  for v in new old; do
    envs=$([ $v = old ] && echo "$OLD" || echo "$NEW")
    env $envs DUSTOFF_PTX_DIR=$S/ptx70 $S/gp --ignored --exact moe_bench::moe_kernel_breakdown --nocapture \
      > $S/breakdown-$v.log 2>&1
    echo "breakdown ($v kernels): rc $?"
  done
  # Side by side: the launches that changed, per token count.
  paste -d'\t' <(grep -E '^\| [0-9]+ \| (router|GEMM|  \(tensor)|^\|  \|' $S/breakdown-new.log) \
    <(grep -E '^\| [0-9]+ \| (router|GEMM|  \(tensor)|^\|  \|' $S/breakdown-old.log) | cut -c1-200
fi

if ! skip bench; then
  for v in new old; do
    envs=$([ $v = old ] && echo "$OLD" || echo "$NEW")
    env $envs $S/dustoff bench --device cuda --ptx-dir $S/ptx70 --synthetic qwen3-30b-a3b --dtype q4_k_m \
      --runs 3 > $S/bench-$v.log 2>&1
    echo "bench one stream ($v kernels): rc $?"; grep -iE 'prefill|decode' $S/bench-$v.log | head -4
  done
fi

if ! skip job; then
  for j in ${GMP_JOBS:-new b2048 old}; do case $j in
    new) env $NEW JB_KV=f16 bash scripts/job-bench.sh dustoff ;;
    b2048) env $NEW JB_KV=f16 JB_TAG=-b2048 JB_ARGS="--max-batch-tokens 2048" bash scripts/job-bench.sh dustoff ;;
    old) JB_KV=f16 JB_TAG=-old bash scripts/job-bench.sh dustoff ;;
  esac; done
fi

if ! skip profile; then
  # Where a job step's time goes: the first 200 documents with GPU time per kernel class
  # (DUSTOFF_PROFILE=1: graphs off, printed by step size when the backend is dropped).
  J=$HOME/jb; head -200 $J/docs.jsonl > $S/docs200.jsonl
  env $NEW DUSTOFF_PROFILE=1 $J/dustoff run scripts/job-bench/nightly.toml --input $S/docs200.jsonl --output $S/prof.jsonl \
    --model $J/qwen3-30b-a3b.gguf --device cuda --ptx-dir $S/ptx70 --max-gpu-memory 32GB --kv-cache f16 \
    --restart --quiet > $S/profile.log 2>&1
  echo "profiled job (200 documents): rc $?"; grep -E '^profile:' $S/profile.log | cut -c1-160
fi
cp $S/*.log $OUT/ 2>/dev/null
exit 0
