#!/usr/bin/env bash
# One-stream speed of two binaries side by side in one lease (issue 30's check that the
# restructure did not slow the GPU path): docs/BENCHMARKS.md's Q1/Q2 (Qwen3-8B shape Q4_K_M) and
# M1/M2 (Qwen3-30B-A3B shape Q4_K_M) commands, each binary from its own compute_70 PTX,
# alternating binaries per model. Pack on the dev VM (OLD: a build of the older commit):
#   OLD=target-old/release/dustoff bash scripts/gpu-speed-ab.sh pack     (carry .gpu)
# then on the GPU machine: bash scripts/gpu-speed-ab.sh run
# Options of run: ROUNDS=N (default 2) alternating rounds; BATCH=64 (bench --batch 64 instead
# of one stream); NEW_ENV="DUSTOFF_X=0" adds a third column: the new binary under that setting.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  set -e; mkdir -p .gpu; lib=$(bash scripts/nvrtc12.sh)
  for b in new old; do
    bin=target/release/dustoff; [ $b = old ] && bin=$OLD
    strip -o /tmp/ab-$b $bin; xz -6 -T2 -c /tmp/ab-$b > .gpu/$b.xz
    rm -rf /tmp/ptx-$b; LD_LIBRARY_PATH=$lib $bin kernels --arch compute_70 --out /tmp/ptx-$b >/dev/null
    tar -C /tmp -cf - ptx-$b | xz -6 -T2 > .gpu/ptx-$b.tar.xz
    $bin --version > .gpu/$b.version
  done
  rm -rf .gpu/tok; cp -r /work/shared/testdata/arch/qwen3_moe/hf .gpu/tok; rm -f .gpu/tok/model.safetensors
  du -sh .gpu; exit 0
fi
W=$HOME/ab; mkdir -p $W
for b in new old; do
  [ -x $W/$b ] || { xz -dc .gpu/$b.xz > $W/$b; chmod +x $W/$b; tar -C /tmp -xJf .gpu/ptx-$b.tar.xz; }
  echo "$b: $(cat .gpu/$b.version)"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
variants="old new"; [ -n "${NEW_ENV:-}" ] && variants="old new new+env"
mode=""; [ -n "${BATCH:-}" ] && mode="--batch $BATCH"
for shape in qwen3-8b qwen3-30b-a3b; do
  f=$W/$shape.gguf
  [ -f $f ] || $W/new synth --shape $shape --type q4_k_m --tokenizer .gpu/tok --output $f --force 2>&1 | tail -1
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for v in $variants; do
      b=${v%+env}; e=""; [ $v = new+env ] && e="$NEW_ENV"
      env $e $W/$b bench --model $f --device cuda --runs 3 $mode --ptx-dir /tmp/ptx-$b > $W/$v-$shape-$r.log 2>&1
      echo "$v $shape round $r: rc $? $(grep -iE '^prefill|^decode|sequences: prefill' $W/$v-$shape-$r.log | tr -s ' ' | tr '\n' ';' | cut -c1-300)"
    done
  done
done
cp $W/*.log $OUT/ 2>/dev/null
