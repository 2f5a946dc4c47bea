#!/usr/bin/env bash
# A change to kernels and their launchers (grid, block): this commit's binary and compute_70 PTX
# against a base commit's binary and PTX, in one lease, beside llama.cpp. GPU calls on one warm
# machine (each under the 10-minute limit of a call):
#   prep   the whole gpu_parity suite from this commit's PTX (gpu-parity-full.sh's skips), then
#          NATIVE_SEL natively, while llama.cpp builds and `dustoff synth` writes the 30B file
#          (scripts/gpu-batched-peer.sh build)
#   job    the nightly job (scripts/job-bench.sh, JB_KV: auto unless set) with base and new,
#          alternating for AB_ROUNDS rounds (2 unless set); AB_PROFILE=1: one round each with
#          DUSTOFF_PROFILE=1 (graphs off; the per-class GPU times of the run logs)
#   peer   llama.cpp's row of the same job and the ratio of every dustoff row (JB_PEER_CT=f16)
#   dev VM:      cargo build --release --all-targets  (this commit), and the base commit's binary
#                built elsewhere (a worktree with its own CARGO_TARGET_DIR)
#                BASE_BIN=<base dustoff> bash scripts/gpu-binary-ab.sh pack
#   GPU machine: bash scripts/gpu-binary-ab.sh prep | job | peer      (carry .gpu)
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = pack ]; then
  set -e
  bash scripts/gpu-route-flips.sh pack >/dev/null
  JB_RECORDS=${JB_RECORDS:-600} bash scripts/job-bench.sh pack >/dev/null
  base=${BASE_BIN:?the base commit\'s dustoff binary}
  strip -o /tmp/ab-base "$base"; xz -6 -T2 -c /tmp/ab-base > .gpu/dustoff-base.xz
  lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70-base
  LD_LIBRARY_PATH=$lib "$base" kernels --arch compute_70 --out /tmp/ptx70-base >/dev/null
  tar -C /tmp -cf - ptx70-base | xz -6 -T2 > .gpu/ptx70-base.tar.xz
  du -sh .gpu; exit 0
fi
W=$HOME/jb; mkdir -p $W; L=${OUT:-$W}
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -x $W/dustoff ] || { xz -dc .gpu/dustoff.xz > $W/dustoff; chmod +x $W/dustoff; }
[ -x $W/dustoff-base ] || { xz -dc .gpu/dustoff-base.xz > $W/dustoff-base; chmod +x $W/dustoff-base; }
[ -d $W/ptx70 ] || tar -C $W -xJf .gpu/ptx70.tar.xz
[ -d $W/ptx70-base ] || tar -C $W -xJf .gpu/ptx70-base.tar.xz
case "${1:-}" in
prep)
  BP_SHAPES=qwen3-30b-a3b bash scripts/gpu-batched-peer.sh build > $L/build.log 2>&1 &
  timeout 480 bash scripts/gpu-parity-full.sh
  wait; cat $L/build.log ;;
job)
  declare -A BIN=([base]=$W/dustoff-base [new]=$W/dustoff) PTXD=([base]=$W/ptx70-base [new]=$W/ptx70)
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in base new; do
      tag=-$v-r$r; [ "${AB_PROFILE:-0}" = 1 ] && tag=-$v-prof
      DUSTOFF_PROFILE=${AB_PROFILE:-0} JB_BIN=${BIN[$v]} JB_PTX=${PTXD[$v]} JB_KV=${JB_KV:-auto} JB_TAG=$tag \
        bash scripts/job-bench.sh dustoff | grep -E "^dustoff"
      [ "${AB_PROFILE:-0}" = 1 ] && grep -E "^profile:" $W/run-${JB_KV:-auto}$tag.log | head -60 > $L/profile$tag.txt
      cp $W/run-${JB_KV:-auto}$tag.log $L/ 2>/dev/null
    done
  done ;;
peer)
  JB_PEER_CT=${JB_PEER_CT:-f16} JB_NPP=${JB_NPP:-1520} bash scripts/job-bench.sh peer ;;
*) echo "usage: $0 pack | prep | job | peer" >&2; exit 2 ;;
esac
