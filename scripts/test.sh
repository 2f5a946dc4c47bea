#!/usr/bin/env bash
# The test command of the README: fetches what the tests need (the sample model; NVRTC 12 for the
# compute_70 kernel check), runs the whole suite in release mode, then assembles the compute_70
# PTX with CUDA 11.8's and 12.9's ptxas (scripts/ptxas-check.sh: a few minutes of ptxas on 2
# cores, cached in ~/.cache/ptxas by file hash).
set -euo pipefail
cd "$(dirname "$0")/.."
samples/fetch-model.sh
lib=$(scripts/nvrtc12.sh)
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo test --release "$@"
scripts/ptxas-check.sh
