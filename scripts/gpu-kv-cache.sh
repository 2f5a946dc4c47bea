#!/usr/bin/env bash
# The 8-bit KV cache against F16 on the GPU (issue 29): gpu_parity from compute_70 PTX and natively,
# the kv_q8 / fp16_overflow / no_cublas tests with their errors, then bench --batch 64,128 for
# synthetic Qwen3-8B and Qwen3-30B-A3B Q4_K_M with --kv-cache f16 and q8 (share of the step bound).
# Packed on the dev VM into .gpu2/ (gp.gz, dustoff.gz, ptx.tar.gz of `dustoff kernels --arch
# compute_70`, commit) with .gpu/td.tar.xz (../shared/testdata); run: bash .gpu2/c2.sh (this file), carry .gpu .gpu2.
set -u
S=$HOME/st2; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat .gpu2/commit
gzip -dc .gpu2/gp.gz > $S/gp; gzip -dc .gpu2/dustoff.gz > $S/dustoff; chmod +x $S/gp $S/dustoff
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz 2>/dev/null || ls /work/shared/testdata
tar -C $S -xzf .gpu2/ptx.tar.gz; grep -h '^\.version' $S/ptx70/*.ptx | sort | uniq -c
SK="--skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device"
t=$(date +%s); DUSTOFF_PTX_DIR=$S/ptx70 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 $SK > $S/ptx.log 2>&1; echo "parity from compute_70 PTX: rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/ptx.log | head -12
t=$(date +%s); DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 $SK > $S/nat.log 2>&1; echo "parity native: rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/nat.log | head -12
DUSTOFF_PTX_DIR=$S/ptx70 $S/gp kv_q8 fp16_overflow no_cublas --nocapture 2>&1 | grep -E 'relative error|^test ' | sort | uniq -c | sort -rn | head -20
for shape in qwen3-8b qwen3-30b-a3b; do for kv in f16 q8; do
  echo "== $shape q4_k_m kv $kv"; $S/dustoff bench --synthetic $shape --dtype q4_k_m --device cuda --ptx-dir $S/ptx70 --batch 64,128 --kv-cache $kv 2>&1 | tail -5
done; done
cp $S/ptx.log $S/nat.log $OUT/
