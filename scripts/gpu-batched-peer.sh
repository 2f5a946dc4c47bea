#!/usr/bin/env bash
# Batched decode side by side with llama.cpp on the same GGUF files (issue 29's headline goals:
# Qwen3-30B-A3B >= 4x the peer at 64 and 128 sequences, Qwen3-8B >= 3x at 64), 768-token prompts
# and 200 generated tokens a sequence: llama.cpp's `llama-batched-bench` (F16 cache; with
# BP_Q8=1 also q8_0) against dustoff's `bench --batch` from compute_70 PTX (F16 cache and the
# 8-bit cache), one table per shape. The files are `dustoff synth` ones (random weights,
# llama.cpp's Q4_K_M mix). The hybrid MoE shape (issue 29: Qwen3.6-35B-A3B >= 4x at 64) runs the
# same way: `BP_SHAPES=qwen3.6-35b-a3b BP_NPL=8,32,64 BP_ONE=1` (its tokenizer: .gpu/tok35).
#
#   dev VM:      bash scripts/job-bench.sh pack          (binary, compute_70 PTX, tokenizer, peer sources)
#   GPU machine: bash scripts/gpu-batched-peer.sh build  (carry .gpu: llama.cpp ~5 min, the files)
#                bash scripts/gpu-batched-peer.sh bench  (same warm machine: both engines, the table)
#
# Knobs: BP_SHAPES ("qwen3-30b-a3b qwen3-8b"), BP_NPL (64,128), BP_Q8 (0), BP_ONE (0; 1: also one
# stream, 768 + 200, both engines: llama-bench and `dustoff bench`, 3 runs each).
set -u
cd "$(dirname "$0")/.."
W=$HOME/jb; B=$W/dustoff; L=$HOME/llamacpp/build/bin
SHAPES=${BP_SHAPES:-"qwen3-30b-a3b qwen3-8b"}; NPL=${BP_NPL:-64,128}
# The tokenizer `synth` writes into a shape's file: the hybrid families have their own.
tok() { case $1 in qwen3.5*|qwen3.6*) echo .gpu/tok35 ;; *) echo .gpu/tok ;; esac; }
case "${1:-}" in
build)
  echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  mkdir -p $W
  [ -x $B ] || { xz -dc .gpu/dustoff.xz > $B; chmod +x $B; }
  [ -d $W/ptx70 ] || tar -C $W -xJf .gpu/ptx70.tar.xz
  for s in $SHAPES; do
    t=$(date +%s)
    [ -f $W/$s.gguf ] || $B synth --shape $s --type q4_k_m --tokenizer $(tok $s) --output $W/$s.gguf --force 2>&1 | tail -1
    echo "synth $s $(( $(date +%s)-t )) s"
  done
  t=$(date +%s)
  [ -x $L/llama-batched-bench ] || bash .gpu/peer/build-llamacpp.sh > $W/peer-build.log 2>&1
  echo "llama.cpp: rc $? in $(( $(date +%s)-t )) s" ;;
bench)
  echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  n_max=${NPL##*,}
  for s in $SHAPES; do
    F=$W/$s.gguf
    if [ "${BP_ONE:-0}" = 1 ]; then
      $L/llama-bench -m $F -ngl 99 -fa 1 -p 768 -n 200 -r 3 > $W/bp-llama-$s-one.log 2>&1
      echo "llama-bench $s: rc $?"
      $B bench --model $F --device cuda --ptx-dir $W/ptx70 --runs 3 > $W/bp-dustoff-$s-one.log 2>&1
      echo "dustoff bench $s: rc $?"
    fi
    cts="f16"; [ "${BP_Q8:-0}" = 1 ] && cts="f16 q8_0"
    for ct in $cts; do
      $L/llama-batched-bench -m $F -ngl 99 -c $(( n_max * 1024 )) -b 2048 -ub 512 -npp 768 -ntg 200 -npl $NPL \
        -fa on -ctk $ct -ctv $ct > $W/bp-llama-$s-$ct.log 2>&1
      echo "llama-batched-bench $s $ct: rc $?"
    done
    for kv in f16 q8; do
      $B bench --model $F --device cuda --ptx-dir $W/ptx70 --batch $NPL --gen-tokens 200 --runs 1 --kv-cache $kv \
        > $W/bp-dustoff-$s-$kv.log 2>&1
      echo "dustoff bench --batch $s $kv: rc $?"
    done
    cp $W/bp-*-$s-*.log $OUT/ 2>/dev/null
  done
  for s in $SHAPES; do
    echo "=== $s (768 + 200 a sequence; decode tok/s summed over the sequences)"
    if [ -f $W/bp-llama-$s-one.log ]; then
      echo "--- one stream: llama-bench pp768 / tg200 t/s, then dustoff bench"
      grep -E "pp768|tg200" $W/bp-llama-$s-one.log; grep -iE "prefill|decode" $W/bp-dustoff-$s-one.log | tail -4
    fi
    for f in $W/bp-llama-$s-f16.log $W/bp-llama-$s-q8_0.log; do
      [ -f $f ] || continue
      echo "--- llama.cpp $(basename $f .log | sed 's/.*-//'): B, prefill t/s, decode t/s"
      awk -F'|' '$2 ~ /768/ {print "B" $4 " S_PP" $7 " S_TG" $9}' $f
    done
    for kv in f16 q8; do echo "--- dustoff $kv"; grep -E "sequences" $W/bp-dustoff-$s-$kv.log | tail -4; done
  done ;;
*) echo "usage: $0 build | bench" >&2; exit 2 ;;
esac
