#!/usr/bin/env bash
# Call B: the sample model assembled; its PTX tests, then the whole suite natively (NVRTC 13).
set -u
cd "$(dirname "$0")/.."
S=$HOME/st
[ -f $S/m1 ] || { echo "machine was not warm: ~/st/m1 missing"; exit 3; }
mkdir -p samples/models; m=samples/models/SmolLM2-135M-Instruct.Q4_1.gguf
cat $S/m1 .gpu-b/m2 | xz -dc > $m; echo "model sha ok: $( [ "$(sha256sum $m | cut -d' ' -f1)" = "$(cat .gpu-b/m.sha)" ] && echo yes || echo NO)"
t=$(date +%s)
DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 sample_model cuda_tap_importance extract_entities_rows constrained_greedy_on_the_device tensor_parallel > $S/ptx_b.log 2>&1; echo "ptx (sample model tests) rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/ptx_b.log | head
t=$(date +%s)
DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 > $S/nat.log 2>&1; echo "native all rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/nat.log | head -20
for job in summarize extract-entities; do
  $S/dustoff run $job --input samples/news.jsonl --output $S/g-$job.jsonl --device cuda --ptx-dir $S/ptx70 2>&1 | grep -E '^done|^tokens'
  $S/dustoff run $job --input samples/news.jsonl --output $S/c-$job.jsonl --device cpu 2>&1 | grep -E '^done'
  python3 -c 'import json,sys; a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]; print(sys.argv[3], "GPU vs CPU rows equal:", sum(x["output"]==y["output"] for x,y in zip(a,b)), "of", len(a))' $S/g-$job.jsonl $S/c-$job.jsonl $job
done
cp $S/ptx_b.log $S/nat.log $OUT/
