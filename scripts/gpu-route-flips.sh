#!/usr/bin/env bash
# Issue 33 on the GPU: gpu_parity's route_flips (random sequences through the four tiny reference
# families, GPU vs CPU routing and logits) natively, from the compute_70 PTX, and natively with
# DUSTOFF_SHEXP_PAIRS=0; then the reference-model hybrid tests. Pack on the dev VM:
#   scripts/gpu-route-flips.sh pack     (after cargo test --release --no-run; writes .gpu/)
# then on the GPU machine: bash scripts/gpu-route-flips.sh run   (carry .gpu)
set -u
if [ "${1:-}" = pack ]; then
  set -e; mkdir -p .gpu
  gp=$(ls -t target/release/deps/gpu_parity-* | grep -v '\.d$' | head -1)
  strip -o /tmp/gp "$gp"; xz -6 -T2 -c /tmp/gp > .gpu/gp.xz
  lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70
  LD_LIBRARY_PATH=$lib target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70 >/dev/null
  tar -C /tmp -cf - ptx70 | xz -6 -T2 > .gpu/ptx70.tar.xz
  tar -C /work/shared -cf - testdata/arch | xz -6 -T2 > .gpu/td.tar.xz
  git log -1 --format='%h %s' > .gpu/commit; du -sh .gpu; exit 0
fi
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz
export DUSTOFF_REQUIRE_GPU=1
run() { local mode=$1 envs=$2; shift 2; local t=$(date +%s); env $envs $S/gp "$@" --test-threads 1 --nocapture > $S/$mode.log 2>&1
  echo "$mode: rc $? $(( $(date +%s)-t )) s"; grep -E '^test result|FAILED|panicked' $S/$mode.log | head -8; }
if [ "${1:-}" = diag ]; then
  # The tallies with no bound: one chunk, token by token, pieces of 8 with f32 matmul inputs;
  # then the CPU with its cached K/V rounded to F16 as the GPU stores them.
  run d_chunk "DUSTOFF_FLIPS_TAPS=1" --ignored route_flips_diag
  run d_tok "DUSTOFF_FLIPS_TAPS=1 DUSTOFF_FLIPS_PIECE=1" --ignored route_flips_diag
  run d_p8f32 "DUSTOFF_FLIPS_TAPS=1 DUSTOFF_FLIPS_PIECE=8 DUSTOFF_TC_MIN_TOKENS=9" --ignored route_flips_diag
  run d_chunk_kv16 "DUSTOFF_FLIPS_TAPS=1 DUSTOFF_FLIPS_CPU_F16_CACHE=1" --ignored route_flips_diag
  run d_tok_kv16 "DUSTOFF_FLIPS_TAPS=1 DUSTOFF_FLIPS_PIECE=1 DUSTOFF_FLIPS_CPU_F16_CACHE=1" --ignored route_flips_diag
  run d_p8f32_kv16 "DUSTOFF_FLIPS_TAPS=1 DUSTOFF_FLIPS_PIECE=8 DUSTOFF_TC_MIN_TOKENS=9 DUSTOFF_FLIPS_CPU_F16_CACHE=1" --ignored route_flips_diag
  cp $S/*.log $OUT/ 2>/dev/null
  for f in $S/d_*.log; do echo "== $f"; grep -E 'random sequences, ' $f | sed -E 's/ random sequences, [0-9]+ logit rows//'; grep 'qwen3_moe random #1 .*relative error before' $f | head -1; done
  exit 0
fi
run native "" route_flips
run ptx70 DUSTOFF_PTX_DIR=$S/ptx70 route_flips
run nopairs DUSTOFF_SHEXP_PAIRS=0 route_flips_qwen3
cp $S/*.log $OUT/ 2>/dev/null
echo "== summary"
for mode in native ptx70 nopairs; do grep -E 'random sequences, ' $S/$mode.log | sed -E 's/ random sequences, [0-9]+ logit rows//' | sed "s/^/$mode: /"; done
