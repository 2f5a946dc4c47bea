#!/usr/bin/env bash
# The test command of the README: fetches what the tests need (the sample model; NVRTC 12 for the
# compute_70 kernel check), then runs the whole suite in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
samples/fetch-model.sh
lib=$(scripts/nvrtc12.sh)
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo test --release "$@"
