#!/usr/bin/env bash
# Nsight Compute on the kernels of a batched decode step (64 sequences by default), from the
# compute_70 PTX: where each kernel's warps wait (the stall reasons per issued instruction),
# its occupancy and its share of DRAM / SM / shared-memory throughput. Pack on the dev VM:
#   bash scripts/gpu-r128.sh pack      then on the GPU machine (carry .gpu):
#   bash scripts/gpu-ncu-step.sh       (KERNELS="regex@shape@prompt@count ..." to choose)
set -u
cd "$(dirname "$0")/.."
S=$HOME/st; mkdir -p $S; L=${OUT:-$S}
ncu=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $(cat .gpu/commit)"
xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/dustoff; rm -rf $S/ptx70; tar -C $S -xJf .gpu/ptx70.tar.xz
B=${BATCH:-64}
# regex of the kernels @ synthetic shape @ prompt tokens @ launches profiled [@ VAR=V,VAR=V]: the
# first ones of the first decode step (the prompts are prefilled in one step of B x prompt tokens,
# so every decode step has B tokens; the prefill takes other tiles, w128 / w48, and its own
# attention; MAX_BATCH_TOKENS=2048, the bench's default, profiles the mixed steps of ~124 tokens
# that follow the first prompts instead). NCU_ARGS: more ncu options (e.g. "--section
# MemoryWorkloadAnalysis_Tables": shared-memory bank conflicts); NCU_METRICS: more metrics (e.g.
# "breakdown:l1tex__throughput.avg.pct_of_peak_sustained_elapsed": which L1 unit is busy).
kernels=${KERNELS:-"^gemmq_q[46]_k_t64\$|^attn_decode_tc@qwen3-8b@512@6 ^moe_gemm_.*_t16\$@qwen3-30b-a3b@256@4@DUSTOFF_MOE_T8=0 ^moe_gemm_.*_t8\$@qwen3-30b-a3b@256@4@DUSTOFF_MOE_T8=8"}
i=0
for k in $kernels; do
  IFS=@ read -r re shape prompt count envs <<< "$k"; i=$((i + 1))
  env $(echo "${envs:-}" | tr ',' ' ') timeout 280 $ncu --graph-profiling node -k "regex:$re" -c "$count" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$'${NCU_METRICS:+,$NCU_METRICS} ${NCU_ARGS:-} \
    $S/dustoff bench --device cuda --synthetic $shape --dtype q4_k_m --batch $B --prompt-tokens $prompt \
    --max-batch-tokens ${MAX_BATCH_TOKENS:-$((B * prompt))} --gen-tokens 3 --runs 1 --ptx-dir $S/ptx70 > $L/ncu-$i.log 2>&1
  echo "== $re ($shape, $B sequences${envs:+, $envs}): rc $?"
  grep -E '^  [a-z_0-9]+.*\(|Grid Size|Registers Per|Duration|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issue Slots Busy|stalled_(long_scoreboard|short_scoreboard|barrier|mio_throttle|math_pipe|wait|lg_throttle)' \
    $L/ncu-$i.log | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g' | head -${LINES_PER:-80}
done
