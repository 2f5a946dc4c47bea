#!/usr/bin/env bash
# Call A: unpack into ~/st, keep model part 1, GPU parity from compute_70 PTX without the sample model.
set -u
cd "$(dirname "$0")/.."
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu-a/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu-a/gp.xz > $S/gp; xz -dc .gpu-a/dustoff.xz > $S/dustoff; chmod +x $S/gp $S/dustoff
tar -C $S -xJf .gpu-a/ptx70.tar.xz; mkdir -p /work/shared; tar -C /work/shared -xJf .gpu-a/td.tar.xz
cp .gpu-a/m1 $S/m1
t=$(date +%s)
DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 --skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device > $S/ptx_a.log 2>&1; echo "ptx (no sample model) rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/ptx_a.log | head -20
cp $S/ptx_a.log $OUT/
