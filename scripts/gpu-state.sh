#!/usr/bin/env bash
# Issue 30 step 4 on the GPU (recurrent state owned by the engine: slots and copy orders in the
# plan, the CUDA backend keeps one device pool of running + snapshot slots): every gpu_parity
# test that runs a hybrid model's state (prefix snapshots, restores, graphs, tensor parallel,
# masked steps, eval windows, calibration), natively and from the compute_70 PTX. Pack on the
# dev VM after cargo test --release --no-run:
#   scripts/gpu-route-flips.sh pack      (gp.xz, ptx70.tar.xz, td.tar.xz into .gpu/)
# then on the GPU machine: bash scripts/gpu-state.sh   (carry .gpu)
set -u
S=$HOME/st; mkdir -p $S
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz
mkdir -p /work/shared; tar -C /work/shared -xJf .gpu/td.tar.xz
export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
# qwen35:: (reference, engine with prefix cache on/off, graph replay), hybrid_moe:: (qwen35moe and
# qwen3next: reference, engine prefix on/off, shared-prefix jobs, graph replay, fused norms),
# deltanet:: (kernels over state slots), the hybrid rows of masked, tensor_parallel, eval and
# calibrate, hybrid_diag.
tests="qwen35:: hybrid_moe:: deltanet:: hybrid_diag constrained_greedy_on_the_device_for_a_hybrid_model
  moe_and_hybrid_models_split_on_one_gpu cuda_eval_of_batched_windows_matches_the_cpu_on_every_family
  cuda_tap_matches_the_cpu_on_moe_and_hybrid_models_token_by_token cuda_calibration_of_moe_and_hybrid_models_covers_every_matrix"
run() { local mode=$1; shift; local t=$(date +%s); env "$@" $S/gp $tests --test-threads 2 > $S/$mode.log 2>&1
  echo "$mode: rc $? $(( $(date +%s)-t )) s"; grep -E '^test result|FAILED|panicked' $S/$mode.log | head -12; }
run native
run ptx70 DUSTOFF_PTX_DIR=$S/ptx70
cp $S/*.log $OUT/ 2>/dev/null
