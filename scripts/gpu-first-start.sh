#!/usr/bin/env bash
# A first start from compute_70 PTX with the driver's cache off (CUDA_CACHE_DISABLE=1: every module
# JIT-compiled, as on a V100 box the first time): the "kernels ready in" seconds of `dustoff generate`
# on a model file, for this binary and (FS_BASE) another one, FS_RUNS rounds alternating; then
# whether both wrote the same text (greedy, so the same kernels' results give the same bytes).
#   GPU machine: FS_MODEL=F.gguf FS_BASE=$HOME/jb/dustoff-base bash scripts/gpu-first-start.sh
# Knobs: FS_BIN ($HOME/jb/dustoff), FS_PTX ($HOME/jb/ptx70), FS_RUNS (1).
set -u
B=${FS_BIN:-$HOME/jb/dustoff}; PTX=${FS_PTX:-$HOME/jb/ptx70}; M=${FS_MODEL:?a model file}
W=$(mktemp -d)
for r in $(seq "${FS_RUNS:-1}"); do
  for b in $B ${FS_BASE:-}; do
    n=$(basename "$b"); t=$(date +%s)
    CUDA_CACHE_DISABLE=1 timeout 300 "$b" generate --model "$M" --device cuda --ptx-dir "$PTX" \
      --prompt "The nightly job" --max-tokens 16 > "$W/$n.txt" 2> "$W/$n.log"
    echo "$n round $r: rc $? in $(( $(date +%s) - t )) s; $(grep -o 'kernels ready in [0-9.]* s' "$W/$n.log")"
  done
done
if [ -n "${FS_BASE:-}" ]; then
  cmp -s "$W/$(basename "$B").txt" "$W/$(basename "$FS_BASE").txt" && echo "same text from both binaries" \
    || echo "the binaries wrote different text"
fi
