#!/usr/bin/env bash
# CPU backend benchmark on the sample model: prefill and decode tok/s (medians of the runs)
# with the rayon thread count and the load average (the numbers mean little on a busy machine).
#   scripts/bench-cpu.sh [THREADS] [BINARY]     (defaults: all cores, target/release/dustoff)
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
bin="${2:-target/release/dustoff}"
[ -x "$bin" ] || cargo build --release --quiet
echo "threads $threads, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
RAYON_NUM_THREADS="$threads" "$bin" bench --device cpu --prompt-tokens 256 --gen-tokens 64 --runs 3 2>/dev/null |
    awk -v t="$threads" '/^prefill/ {p=$2} /^decode/ {d=$2} END {printf "prefill %s tok/s  decode %s tok/s  (threads %s)\n", p, d, t}'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
