#!/usr/bin/env bash
# gpu_parity's suites over the packed and grouped GEMMs and the models end to end (quant,
# moe_gemm, gemm, route_flips, seq_positions, no_cublas), from the compute_70 PTX and natively,
# (PARITY_SEL: other suites) on the GPU machine after a script unpacked the gpu_parity binary and ptx70 into $HOME/st
# (scripts/gpu-r128.sh, scripts/gpu-stage16.sh call it). Logs ptx.log, native.log into DIR.
#   bash scripts/gpu-parity-subset.sh DIR
set -u
S=$HOME/st L=$1
sel=${PARITY_SEL:-"quant moe_gemm gemm route_flips seq_positions no_cublas"}
t=$(date +%s); DUSTOFF_PTX_DIR=$S/ptx70 $S/gp --test-threads 4 $sel > $L/ptx.log 2>&1
echo "parity from compute_70 PTX ($sel): rc $? $(( $(date +%s)-t )) s"; grep -E '^test result|FAILED|panicked' $L/ptx.log | head -8
t=$(date +%s); $S/gp --test-threads 4 $sel > $L/native.log 2>&1
echo "parity natively: rc $? $(( $(date +%s)-t )) s"; grep -E '^test result|FAILED|panicked' $L/native.log | head -8
