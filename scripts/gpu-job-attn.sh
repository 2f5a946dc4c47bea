#!/usr/bin/env bash
# Where a nightly-job step's attention time goes, switch by switch: the first JA_DOCS (200)
# documents of the job benchmark (scripts/job-bench.sh) under DUSTOFF_PROFILE=1 (graphs off; GPU
# time per kernel class by step size), once per variant of the decode attention switches, all
# from the compute_70 PTX in one lease. Pack on the dev VM with `JB_RECORDS=600 bash
# scripts/gpu-moe-prefill.sh pack`; on the GPU machine: bash scripts/gpu-job-attn.sh (carry .gpu).
# JA_VARIANTS: variants as NAME=SWITCHES,SWITCHES (commas between switches); JA_ARGS: more run arguments.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; J=$HOME/jb; S=$HOME/ja; mkdir -p $S
# The model, binary, PTX and documents (job-bench.sh dustoff makes them; JB_KV= runs no job).
JB_KV=" " bash scripts/job-bench.sh dustoff > /dev/null 2>&1
head -${JA_DOCS:-200} $J/docs.jsonl > $S/docs.jsonl
variants=${JA_VARIANTS:-"base=X=1 nocascade=DUSTOFF_CASCADE=0 split256=DUSTOFF_ATTN_SPLIT=256 twopass=DUSTOFF_ATTN_ONEPASS=0"}
for v in $variants; do
  name=${v%%=*}; envs=$(echo "${v#*=}" | tr ',' ' ')
  t=$(date +%s)
  # shellcheck disable=SC2086 # envs and JA_ARGS are lists
  env $envs DUSTOFF_PROFILE=1 $J/dustoff run scripts/job-bench/nightly.toml --input $S/docs.jsonl \
    --output $S/o-$name.jsonl --model $J/qwen3-30b-a3b.gguf --device cuda --ptx-dir $J/ptx70 \
    --max-gpu-memory 32GB --kv-cache f16 --restart --quiet ${JA_ARGS:-} > $S/$name.log 2>&1
  echo "$name ($envs): rc $? in $(( $(date +%s)-t )) s"
done
cp $S/*.log $OUT/ 2>/dev/null
echo "== GPU ms by class: steps of 2-64 tokens | steps above 256 tokens; job wall"
for v in $variants; do name=${v%%=*}; python3 - $S/$name.log $name <<'PY'
import re, sys
cls, out = None, {}
for l in open(sys.argv[1]):
    m = re.search(r"profile: (\S+) tokens?: (\d+) steps", l)
    if m: cls = m.group(1); continue
    m = re.search(r"profile:\s+(.+?)\s+([\d.]+) ms\s+[\d.]+%", l)
    if m and cls: out[(cls, m.group(1).strip())] = float(m.group(2))
wall = re.search(r"time: ([\d.]+) s wall", open(sys.argv[1]).read())
row = lambda c: " ".join(f"{k.split()[0][:6]}={out[(c, k)]:.0f}" for k in ("attention split", "attention prefill", "moe ffn") if (c, k) in out)
print(f"{sys.argv[2]:>10}: [2-64] {row('2-64')} | [>256] {row('>256')} | wall {wall.group(1) if wall else '?'} s")
PY
done
