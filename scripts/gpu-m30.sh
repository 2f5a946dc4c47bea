#!/usr/bin/env bash
# Issue 12 on the GPU: a Qwen3-30B-A3B-shaped Q4_K_M GGUF (dustoff synth) through run and bench,
# from compute_70 PTX and natively. Run on the GPU machine from the repository root with .gpu/ holding
# dustoff, ptx70/ (dustoff kernels --arch compute_70) and qwen3_moe_hf/ (../shared/testdata/arch/qwen3_moe/hf:
# the tokenizer written into the file). Writes 18.6 GB under ~/m30.
set -u
cd "$(dirname "$0")/.."
G=${GPU_DIR:-.gpu}; B=$G/dustoff; chmod +x $B
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
T=$HOME/m30; mkdir -p $T
git log -1 --format='commit %h %s' 2>/dev/null || cat $G/commit
t0=$(date +%s)
$B synth --shape qwen3-30b-a3b --type q4_k_m --tokenizer $G/qwen3_moe_hf --output $T/q30.gguf --force 2>&1 | tail -3
echo "synth $(( $(date +%s)-t0 )) s"
for job in summarize extract-entities; do
  t=$(date +%s)
  $B run $job --input samples/news.jsonl --output $T/$job.jsonl --model $T/q30.gguf --device cuda --ptx-dir $G/ptx70 2>&1 | tail -4
  echo "$job wall $(( $(date +%s)-t )) s; rows: $(wc -l < $T/$job.jsonl)"
  cp $T/$job.jsonl $OUT/ 2>/dev/null
done
python3 - <<'PY' "$T/extract-entities.jsonl" || true
import json,sys
n=ok=0
for l in open(sys.argv[1]):
    n+=1; r=json.loads(l)
    v=r.get('entities', r.get('output'))
    ok+= v is not None
print(f"extract rows {n}, with a value {ok}")
PY
$B bench --model $T/q30.gguf --device cuda --ptx-dir $G/ptx70 --runs 3 > $T/b_ptx.txt 2>&1; tail -25 $T/b_ptx.txt
$B bench --model $T/q30.gguf --device cuda --runs 3 > $T/b_nat.txt 2>&1; tail -25 $T/b_nat.txt
$B bench --model $T/q30.gguf --device cuda --ptx-dir $G/ptx70 --batch 8,32,64 --runs 1 > $T/b_batch.txt 2>&1; tail -25 $T/b_batch.txt
cp $T/b_*.txt $OUT/ 2>/dev/null
echo "total $(( $(date +%s)-t0 )) s"
