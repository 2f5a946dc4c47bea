#!/usr/bin/env bash
# Issue 34 on the GPU: gpu_parity from the ISA-7.0 compute_70 PTX (dustoff kernels), then NVRTC 11.8 from
# its wheel (nvidia-cuda-nvrtc-cu11==11.8.89: libnvrtc.so.11.2 + builtins, linked as libnvrtc.so first
# on LD_LIBRARY_PATH) compiling the compute_70 PTX and the suite from it. Packed on the dev VM into .gpu/
# (gp.xz, dustoff.xz, ptx.tar.xz holding v70/ and ptx70/, nvrtc11.tar.xz of the wheel lib/, td.tar.xz of
# ../shared/testdata); run: bash .gpu/c1.sh with carry .gpu. The sample-model tests are skipped
# (the model does not fit one call with the binaries).
set -u
S=$HOME/st; mkdir -p $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/gp $S/dustoff
tar -C $S -xJf .gpu/ptx.tar.xz; tar -C $S -xJf .gpu/nvrtc11.tar.xz
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz
grep -h '^\.version' $S/v70/*.ptx | sort | uniq -c
t=$(date +%s)
DUSTOFF_PTX_DIR=$S/v70 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 --skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device > $S/v70.log 2>&1; echo "parity from ISA-7.0 PTX: rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked|no_cublas' $S/v70.log | head -20
grep -E 'no_cublas_vs|relative error' $S/v70.log | grep no_cublas | sort | tail -3
# NVRTC 11.8 from its wheel (cudarc looks for libnvrtc.so first): compile for compute_70 and natively.
mkdir -p $S/n11; ln -sf $S/lib/libnvrtc.so.11.2 $S/n11/libnvrtc.so; cp $S/lib/libnvrtc-builtins.so.11.8 $S/n11/
export LD_LIBRARY_PATH=$S/n11:${LD_LIBRARY_PATH:-}
$S/dustoff doctor 2>&1 | grep -iE 'nvrtc|driver|ptx' | head -8
$S/dustoff kernels --arch compute_70 --out $S/p11 2>&1 | tail -2; grep -h '^\.version' $S/p11/*.ptx | sort | uniq -c
t=$(date +%s)
DUSTOFF_PTX_DIR=$S/p11 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 --skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device --skip bench > $S/p11.log 2>&1; echo "parity from NVRTC 11.8 compute_70 PTX: rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/p11.log | head -10
cp $S/v70.log $S/p11.log $OUT/ 2>/dev/null
