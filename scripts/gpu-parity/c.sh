#!/usr/bin/env bash
# Call C (issue 34), after call A on the same warm machine: the ISA 7.0 PTX and NVRTC 11.8.
# 1. doctor: the driver range and which NVRTC it picks (NVRTC 11.8 named by DUSTOFF_NVRTC);
# 2. the parity suite from NVRTC 11.8's compute_70 PTX (ISA 7.0; A ran NVRTC 12.9's);
# 3. the parity suite natively with NVRTC 11.8 compiling compute_90 (ISA 7.8) on this driver;
# 4. the planted FP16-overflow test from each PTX source.
set -u
cd "$(dirname "$0")/.."
S=$HOME/st
[ -x $S/gp ] || { echo "machine was not warm: run call A first"; exit 3; }
echo "commit $(cat .gpu-c/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $S/nvrtc11; xz -dc .gpu-c/nvrtc11.tar.xz | tar -C $S/nvrtc11 -xf -
tar -C $S -xJf .gpu-c/ptx70-nvrtc11.tar.xz
export DUSTOFF_NVRTC=$S/nvrtc11/libnvrtc.so.11.2
head -12 $S/ptx70/attention_decode.ptx | grep -E '^\.(version|target)'; head -12 $S/ptx70-nvrtc11/attention_decode.ptx | grep -E '^\.(version|target)|release'
$S/dustoff doctor 2>&1 | grep -E 'driver|NVRTC|why|usable|problem' | head -20
skip="--skip tensor_parallel --skip sample_model --skip cuda_tap_importance --skip extract_entities_rows --skip constrained_greedy_on_the_device"
t=$(date +%s)
DUSTOFF_PTX_DIR=$S/ptx70-nvrtc11 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 $skip > $S/ptx11.log 2>&1; echo "ptx (NVRTC 11.8, ISA 7.0) rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/ptx11.log | head -20
t=$(date +%s)
XDG_CACHE_HOME=$S/cache11 DUSTOFF_REQUIRE_GPU=1 $S/gp --test-threads 4 $skip > $S/nat11.log 2>&1; echo "native (NVRTC 11.8 for compute_90) rc $? $(( $(date +%s)-t )) s"
grep -E '^test result|FAILED|panicked' $S/nat11.log | head -20
for p in ptx70 ptx70-nvrtc11; do
  DUSTOFF_PTX_DIR=$S/$p DUSTOFF_REQUIRE_GPU=1 $S/gp fp16_overflow --nocapture 2>&1 | grep -E 'relative error|test result|panicked' | tail -4 | sed "s/^/$p: /"
done
cp $S/ptx11.log $S/nat11.log $OUT/ 2>/dev/null
