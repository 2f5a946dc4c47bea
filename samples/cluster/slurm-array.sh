#!/bin/bash
# One dustoff job split over a Slurm job array: task K of N runs `dustoff run --shard K/N` and
# writes its own output; `dustoff merge` then puts the shards back together in input order.
# See docs/CLUSTER.md.
#
#   sbatch samples/cluster/slurm-array.sh                  # all 4 shards
#   sbatch --array=2 samples/cluster/slurm-array.sh        # rerun (resume) shard 2 only
#   sbatch --dependency=afterok:<array job id> --wrap \
#     "dustoff merge --output out/summaries.jsonl out/summaries/shard-*.jsonl"
#
# Every path must be on a filesystem all nodes share (the checkpoint of each shard lives beside
# its output, in out/summaries/shard-K.jsonl.dustoff/).
#SBATCH --job-name=dustoff-summarize
#SBATCH --array=0-3
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=08:00:00
#SBATCH --requeue
#SBATCH --output=logs/%x-%A_%a.log

set -euo pipefail

# The number of shards: keep it equal to the size of --array above. It is given explicitly
# (not taken from SLURM_ARRAY_TASK_COUNT) so that resubmitting a subset of the tasks
# (`--array=2`) still runs shard 2 of 4, not shard 0 of 1.
SHARDS=${SHARDS:-4}
TASK=${SLURM_ARRAY_TASK_ID:?submit with sbatch (or set SLURM_ARRAY_TASK_ID to try it by hand)}

DUSTOFF=${DUSTOFF:-dustoff}
PIPELINE=${PIPELINE:-pipelines/summarize.toml}
MODEL=${MODEL:-samples/models/SmolLM2-135M-Instruct.Q4_1.gguf}
# A file or a quoted glob such as 'data/2026-11-28/*.jsonl': dustoff expands the glob itself, in
# sorted order, so every task sees the same input set.
INPUT=${INPUT:-samples/news.jsonl}
OUT=${OUT:-out/summaries}
# cuda: a node whose GPU does not work fails loudly instead of running on its CPU.
DEVICE=${DEVICE:-cuda}
# The share of error rows (bad records) a shard may hold and still succeed (exit 0): one
# malformed line in a real archive must not fail the shard and block the merge. The rows are
# still in the output (with an "error" field) and listed in shard-K.jsonl.errors.jsonl.
MAX_ERROR_RATE=${MAX_ERROR_RATE:-0.01}
# `srun` makes dustoff a job step that Slurm signals (SIGTERM) at the time limit or on
# preemption; set SRUN= to run the script by hand outside Slurm.
SRUN=${SRUN-srun}

mkdir -p "$OUT"
rc=0
# shellcheck disable=SC2086  # $SRUN is empty or one word
$SRUN "$DUSTOFF" run "$PIPELINE" \
    --input "$INPUT" \
    --output "$OUT/shard-$TASK.jsonl" \
    --model "$MODEL" \
    --device "$DEVICE" \
    --shard "$TASK/$SHARDS" \
    --max-error-rate "$MAX_ERROR_RATE" \
    --quiet || rc=$?

case $rc in
    0) echo "shard $TASK/$SHARDS done: $OUT/shard-$TASK.jsonl" ;;
    3) if [ -e "$OUT/shard-$TASK.jsonl" ]; then
           echo "shard $TASK/$SHARDS done with error rows over --max-error-rate $MAX_ERROR_RATE: see $OUT/shard-$TASK.jsonl.errors.jsonl"
       else
           echo "shard $TASK/$SHARDS aborted past --max-errors (failed records: $OUT/shard-$TASK.jsonl.errors.jsonl); raise the limit, then resubmit this script with --array=$TASK"
       fi ;;
    4) echo "shard $TASK/$SHARDS interrupted; resubmit this script with --array=$TASK to resume" ;;
    5) echo "shard $TASK/$SHARDS is being computed by another run (it holds the lock); nothing was done" ;;
    *) echo "shard $TASK/$SHARDS failed (exit $rc); see the log above" ;;
esac
exit "$rc"
