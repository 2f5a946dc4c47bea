#!/usr/bin/env bash
# Qwen3.6-35B-A3B (hybrid MoE) side by side with llama.cpp on the same GGUF (issue 29's hybrid
# goal: batched decode at 64 sequences >= 4x the peer; docs/BENCHMARKS.md rows H1-H3 gain a peer
# column). `dustoff synth` writes the file (random weights, llama.cpp's mix; llama.cpp 0c1e57098
# has the qwen35moe architecture and loaded the cut files of the quantization-quality rows).
#
#   dev VM:      bash scripts/gpu-hybrid-peer.sh pack    (after cargo build --release; writes .gpu/)
#   GPU machine: bash scripts/gpu-hybrid-peer.sh build   (carry .gpu: llama.cpp ~5 min, the 21 GB file)
#                bash scripts/gpu-hybrid-peer.sh bench   (same warm machine: both engines, one table)
#
# The pack is job-bench.sh's (binary, compute_70 PTX, the peer's sources) plus the hybrid
# tokenizer, so one lease can run the nightly job's peer rows and these.
set -u
cd "$(dirname "$0")/.."
W=$HOME/jb; B=$W/dustoff; F=$W/qwen3.6-35b-a3b.gguf; L=$HOME/llamacpp/build/bin
NPL=${HP_NPL:-8,32,64}
case "${1:-}" in
pack)
  set -e; JB_RECORDS=${JB_RECORDS:-600} bash scripts/job-bench.sh pack
  rm -rf .gpu/tok35; cp -r /work/shared/testdata/arch/qwen3_5_moe/hf .gpu/tok35; rm -f .gpu/tok35/model.safetensors
  du -sh .gpu ;;
build)
  echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  mkdir -p $W
  [ -x $B ] || { xz -dc .gpu/dustoff.xz > $B; chmod +x $B; }
  [ -d $W/ptx70 ] || tar -C $W -xJf .gpu/ptx70.tar.xz
  t=$(date +%s)
  [ -f $F ] || $B synth --shape qwen3.6-35b-a3b --type q4_k_m --tokenizer .gpu/tok35 --output $F --force 2>&1 | tail -1
  echo "synth $(( $(date +%s)-t )) s"
  t=$(date +%s)
  [ -x $L/llama-batched-bench ] || bash .gpu/peer/build-llamacpp.sh > $W/peer-build.log 2>&1
  echo "llama.cpp: rc $? in $(( $(date +%s)-t )) s"; ls $L ;;
bench)
  echo "commit $(cat .gpu/commit)"
  $L/llama-bench -m $F -ngl 99 -fa 1 -p 768 -n 200 -r 3 > $W/hp-llama-bench.log 2>&1
  echo "llama-bench rc $?"
  $B bench --model $F --device cuda --ptx-dir $W/ptx70 --runs 3 > $W/hp-dustoff-one.log 2>&1
  echo "dustoff bench rc $?"
  n_max=${NPL##*,}
  $L/llama-batched-bench -m $F -ngl 99 -c $(( n_max * 1024 )) -b 2048 -ub 512 -npp 768 -ntg 200 -npl $NPL -fa on \
    > $W/hp-llama-batched.log 2>&1
  echo "llama-batched-bench rc $?"
  $B bench --model $F --device cuda --ptx-dir $W/ptx70 --batch $NPL > $W/hp-dustoff-batch.log 2>&1
  echo "dustoff bench --batch rc $?"
  cp $W/hp-*.log $OUT/ 2>/dev/null
  echo "--- llama-bench (pp768 / tg200, t/s)"; grep -E "pp768|tg200" $W/hp-llama-bench.log
  echo "--- dustoff bench (one stream)"; grep -iE "prefill|decode|bound" $W/hp-dustoff-one.log | tail -6
  echo "--- llama-batched-bench (B sequences, prefill and decode t/s)"; awk -F'|' '$2 ~ /768/ {print "B" $4 " S_PP" $7 " S_TG" $9}' $W/hp-llama-batched.log
  echo "--- dustoff bench --batch"; grep -E "^\|" $W/hp-dustoff-batch.log ;;
*) echo "usage: $0 pack | build | bench" >&2; exit 2 ;;
esac
