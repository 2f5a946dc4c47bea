#!/usr/bin/env bash
# The qwen2moe GPU checks (tests/gpu_parity/qwen2moe.rs: the tiny transformers reference of
# tests/data/arch/qwen2_moe on CUDA, against transformers and the CPU backend) natively and from
# the compute_70 PTX. They fail until the CUDA layer pass runs the shared expert on
# plain-attention layers (issue 30). Pack on the dev VM after
# `cargo test --release --test gpu_parity --no-run`:
#   bash scripts/gpu-qwen2moe.sh pack       (writes .gpu/: the test binary and the PTX)
# then on the GPU machine, from the repository root: bash scripts/gpu-qwen2moe.sh run  (carry .gpu)
set -u
if [ "${1:-}" = pack ]; then
  set -e; rm -rf .gpu; mkdir -p .gpu
  gp=$(ls -t target/release/deps/gpu_parity-* | grep -v '\.d$' | head -1)
  strip -o /tmp/gp "$gp"; xz -6 -T2 -c /tmp/gp > .gpu/gp.xz
  lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70
  LD_LIBRARY_PATH=$lib target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70 >/dev/null
  tar -C /tmp -cf - ptx70 | xz -6 -T2 > .gpu/ptx70.tar.xz
  git log -1 --format='%h %s' > .gpu/commit; du -sh .gpu; exit 0
fi
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz
export DUSTOFF_REQUIRE_GPU=1
for mode in native ptx70; do
  envs=""; [ $mode = ptx70 ] && envs="DUSTOFF_PTX_DIR=$S/ptx70"
  t=$(date +%s); env $envs $S/gp qwen2moe --test-threads 1 --nocapture > $S/$mode.log 2>&1
  echo "$mode: rc $? $(( $(date +%s)-t )) s"; grep -E '^test |^test result|FAILED|panicked|qwen2moe .*(L2|tokens compared|largest)' $S/$mode.log | head -40
done
cp $S/*.log ${OUT:-/tmp}/ 2>/dev/null
