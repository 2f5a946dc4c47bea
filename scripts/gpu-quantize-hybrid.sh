#!/usr/bin/env bash
# Issue 32 (CPU side) checked on the GPU: the tiny MoE / hybrid reference models converted from
# HF and quantized (q4_k_m, calibrated on the CPU: every expert from its routed tokens, the
# shared expert, the DeltaNet projections), then run by the CUDA backend and by the CPU backend
# on the same prompt ids: the quantized files load on the GPU (Q8_0 attn_qkv/attn_k, Q5_K
# attn_output, Q5_0/Q8_0 fallbacks, per-expert slabs) and decode the same greedy tokens as the
# CPU where the margins allow (prints both; a differing tail after a near-tie is possible).
# Run from the repository root with target/release/dustoff built and ../shared/testdata present:
#   bash scripts/gpu-quantize-hybrid.sh
set -u
B=target/release/dustoff; T=../shared/testdata/arch; D=$(mktemp -d)
for a in qwen3_5 qwen3_5_moe qwen3_next; do
  $B quantize --device cpu --model $T/$a/hf --output $D/$a-q4km.gguf \
    --calibration samples/news.jsonl --imatrix-out $D/$a-imatrix.gguf 2>&1 | grep -E '^(wrote|importance)'
  ids=$(python3 -c "import json;print(json.dumps(json.loads(open('$T/$a/refs.jsonl').readline())['prompt_ids']))")
  echo "{\"id\": \"a\", \"prompt_ids\": $ids}" > $D/in.jsonl
  for dev in cpu cuda; do
    rm -f $D/$dev.jsonl*
    $B generate --device $dev --max-tokens 16 --model $D/$a-q4km.gguf --input $D/in.jsonl --output $D/$dev.jsonl \
      > $D/$dev.log 2>&1 || { echo "$a $dev: FAILED"; tail -5 $D/$dev.log; }
    echo "$a $dev: $(python3 -c "import json;print(json.loads(open('$D/$dev.jsonl').readline())['token_ids'])" 2>/dev/null)"
  done
done
rm -rf "$D"
