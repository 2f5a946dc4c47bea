#!/usr/bin/env bash
# `dustoff eval --device cuda` on the GPU (issue 32, item 3): gpu_parity's eval test (batched
# windows on the GPU against the CPU, the four tiny reference families; prints every number it
# compares) natively and from the compute_70 PTX, then the command itself on one of them, CPU
# and GPU, 1 and 16 windows at a time, with wall times. Pack on the dev VM:
#   cargo test --release --no-run && scripts/gpu-eval.sh pack     (writes .gpu/)
# then on the GPU machine: bash scripts/gpu-eval.sh run   (carry .gpu; output in $OUT)
set -u
if [ "${1:-}" = pack ]; then
  set -e; rm -rf .gpu; mkdir -p .gpu
  gp=$(ls -t target/release/deps/gpu_parity-* | grep -v '\.d$' | head -1)
  strip -o /tmp/gp "$gp"; xz -6 -T2 -c /tmp/gp > .gpu/gp.xz
  strip -o /tmp/dustoff-bin target/release/dustoff; xz -6 -T2 -c /tmp/dustoff-bin > .gpu/dustoff.xz
  lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70
  LD_LIBRARY_PATH=$lib target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70 >/dev/null
  tar -C /tmp -cf - ptx70 | xz -6 -T2 > .gpu/ptx70.tar.xz
  tar -C /work/shared -cf - testdata/arch | xz -6 -T2 > .gpu/td.tar.xz
  git log -1 --format='%h %s' > .gpu/commit; du -sh .gpu; exit 0
fi
S=$HOME/st; mkdir -p $S; OUT=${OUT:-/tmp/out}; mkdir -p $OUT
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/gp $S/dustoff
tar -C $S -xJf .gpu/ptx70.tar.xz
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz
export DUSTOFF_REQUIRE_GPU=1
run() { local mode=$1 envs=$2; shift 2; local t=$(date +%s); env $envs $S/gp "$@" --test-threads 1 --nocapture > $S/$mode.log 2>&1
  echo "$mode: rc $? $(( $(date +%s)-t )) s"; grep -E '^test result|FAILED|panicked|cuda vs cpu|vs 8 windows' $S/$mode.log | head -20; }
run eval_native "" cuda_eval_of_batched_windows
run eval_ptx70 DUSTOFF_PTX_DIR=$S/ptx70 cuda_eval_of_batched_windows
# The command: qwen3_5_moe Q8_0 against its F16 source on the repository's docs (32,768 tokens).
A=/work/shared/testdata/arch/qwen3_5_moe; W=$S/w; mkdir -p $W; rm -f $W/q8.gguf
$S/dustoff quantize --model $A/qwen3_5_moe-f16.gguf --output $W/q8.gguf --type q8_0 --device cpu > /dev/null 2>&1
cat README.md docs/*.md > $W/text.txt
for args in "--device cpu --batch-windows 16" "--device cuda --batch-windows 1" "--device cuda --batch-windows 16"; do
  t=$(date +%s%3N)
  $S/dustoff eval --model $W/q8.gguf --reference $A/qwen3_5_moe-f16.gguf --text $W/text.txt --ctx 256 $args 2> $S/cli.err | tail -3
  echo "eval $args: rc ${PIPESTATUS[0]} $(( $(date +%s%3N) - t )) ms"; tail -2 $S/cli.err
done
cp $S/*.log $OUT/ 2>/dev/null
