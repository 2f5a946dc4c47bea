#!/usr/bin/env bash
# The whole gpu_parity suite on the lent GPU from the compute_70 PTX (the V100 path), then the
# tests this session touched natively. Pack on the dev VM after cargo test --release --no-run:
#   scripts/gpu-route-flips.sh pack      (gp.xz, ptx70.tar.xz, td.tar.xz into .gpu/)
# then on the GPU machine: bash scripts/gpu-parity-full.sh   (carry .gpu)
# The sample-model tests are skipped: the model does not fit one call's carry with the binaries.
set -u
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz
# 32 MiB test-thread stacks: with the default 2 MiB the suite segfaulted now and then (seen with 4 and 16
# threads; with 32 MiB the same build passed): likely a test thread out of stack, not proven.
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
skip="--skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device"
t=$(date +%s)
# PTX_SEL: only these tests from the PTX (a short lease); otherwise the whole suite.
DUSTOFF_PTX_DIR=$S/ptx70 $S/gp --test-threads 4 ${PTX_SEL:-$skip} > $S/ptx.log 2>&1; echo "gpu_parity from compute_70 PTX (${PTX_SEL:-all}): rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/ptx.log | head -20
t=$(date +%s)
# NATIVE=all: the whole suite natively too (same skips); otherwise NATIVE_SEL (the tests a session touched).
if [ "${NATIVE:-}" = all ]; then sel="$skip"; else sel="${NATIVE_SEL:-route_flips seq_positions no_cublas matmul gemm}"; fi
$S/gp --test-threads 4 $sel > $S/native.log 2>&1; echo "gpu_parity natively ($sel): rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/native.log | head -10
cp $S/*.log $OUT/ 2>/dev/null
