#!/usr/bin/env bash
# Issue 29 (memory side) on the GPU: the 8-bit KV cache against F16 at 64 and 128 sequences
# (bench --batch prints the share of each step's bound), within --max-gpu-memory 32GB (a V100's
# card on the H200), for synthetic Qwen3-8B and Qwen3-30B-A3B Q4_K_M GGUFs (dustoff synth), from
# compute_70 PTX. Run on the GPU machine from the repository root with .gpu/ holding dustoff,
# ptx70/ (dustoff kernels --arch compute_70) and qwen3_moe_hf/ (../shared/testdata/arch/qwen3_moe/hf:
# the tokenizer written into the files). Writes ~24 GB under ~/kvq.
set -u
cd "$(dirname "$0")/.."
G=${GPU_DIR:-.gpu}; B=$G/dustoff; chmod +x $B
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
T=$HOME/kvq; mkdir -p $T
git log -1 --format='commit %h %s' 2>/dev/null || cat $G/commit
for shape in qwen3-8b qwen3-30b-a3b; do
  [ -f $T/$shape.gguf ] || $B synth --shape $shape --type q4_k_m --tokenizer $G/qwen3_moe_hf --output $T/$shape.gguf --force 2>&1 | tail -2
  # The plan within 32 GB (no GPU needed), then the runs; a row that does not fit is refused.
  for kv in f16 q8; do
    $B bench --model $T/$shape.gguf --batch 64,128 --kv-cache $kv --max-gpu-memory 32GB --plan 2>&1 | tail -6
    $B bench --model $T/$shape.gguf --device cuda --ptx-dir $G/ptx70 --batch 64,128 --runs 1 --kv-cache $kv \
      > $T/b_${shape}_$kv.txt 2>&1; tail -8 $T/b_${shape}_$kv.txt
    $B bench --model $T/$shape.gguf --device cuda --ptx-dir $G/ptx70 --batch 64 --runs 1 --kv-cache $kv \
      --max-gpu-memory 32GB > $T/b_${shape}_${kv}_32gb.txt 2>&1; tail -6 $T/b_${shape}_${kv}_32gb.txt
  done
done
cp $T/b_*.txt $OUT/ 2>/dev/null
