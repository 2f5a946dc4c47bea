#!/usr/bin/env bash
# Quantization quality, dustoff against llama.cpp, on the tiny reference models of every 2026
# family (../shared/testdata/arch/*/ *-f16.gguf: random weights of transformers' tiny configs):
# each F16 file quantized to q4_k_m and q8_0 by `dustoff quantize` and by `llama-quantize`, with
# and without importance from the same calibration text (dustoff's own calibration; llama-imatrix),
# then every file scored by `dustoff eval` against the F16 file on held-out text (the same windows
# and the same KL code for both quantizers) and by llama.cpp's own KL tool (llama-perplexity
# --kl-divergence) where it loads the file. Prints a markdown table last.
#
#   scripts/quality-table.sh LLAMA_BIN [WORK]
# LLAMA_BIN: a folder with llama-quantize, llama-imatrix, llama-perplexity (a CPU build of the peer
# tree: ../shared/peer/llamacpp-*.tar.gz, cmake -DGGML_CUDA=OFF -DLLAMA_BUILD_APP=OFF ...).
# Real widths on a CPU: ARCH_DIR=DIR holding one folder per model with its <name>-f16.gguf, e.g.
# from `dustoff synth --shape qwen3-30b-a3b --type f16 --layers 2` (see docs/BENCHMARKS.md);
# TYPES="q4_k_m" and LLKL=0 keep such a run to minutes.
# Texts (Debian 12 files, as for the sample model's table in docs/BENCHMARKS.md): calibration =
# GPL-3 + vim's usr_05/usr_06; held-out = vim's usr_01..usr_03 + MPL-2.0.
set -euo pipefail
cd "$(dirname "$0")/.."
L=${1:?usage: scripts/quality-table.sh LLAMA_BIN [WORK]}
W=${2:-/tmp/dustoff-quality}
D=${DUSTOFF:-target/release/dustoff}
ARCH=${ARCH_DIR:-../shared/testdata/arch}
CTX=${CTX:-256}
CHUNKS=${CHUNKS:-8}
TYPES=${TYPES:-q8_0 q4_k_m}   # the quantization types of the table
LLKL=${LLKL:-1}               # 0: no llama-perplexity scores (dustoff eval only; "-" in those columns)
mkdir -p "$W"
V=/usr/share/vim/vim90/doc
cat /usr/share/common-licenses/GPL-3 $V/usr_05.txt $V/usr_06.txt > "$W/calib.txt"
cat $V/usr_01.txt $V/usr_02.txt $V/usr_03.txt /usr/share/common-licenses/MPL-2.0 > "$W/heldout.txt"
# KL of llama.cpp's tool, mean and p99 (its "Mean KLD" and "99.0%" lines), or "-" where it failed.
llkl() {
  local base=$1 model=$2 out
  if out=$("$L/llama-perplexity" -m "$model" -c $CTX --chunks $CHUNKS --kl-divergence-base "$base" --kl-divergence 2>&1 \
    | tee "$model.kld.log"); then
    local mean p99
    mean=$(echo "$out" | awk '/^Mean +KLD:/ {print $3}')
    p99=$(echo "$out" | awk '/^99.0% +KLD:/ {print $3}')
    echo "${mean:--} ${p99:--}"
  else
    echo "- -"
  fi
}
rows=()
for dir in "$ARCH"/*/; do
  fam=$(basename "$dir")
  f16=$(ls "$dir"*-f16.gguf 2>/dev/null | head -1) || true
  [ -n "$f16" ] || continue
  o=$W/$fam; mkdir -p "$o"
  echo "== $fam" >&2
  base_ok=1
  if [ "$LLKL" = 1 ]; then
    "$L/llama-perplexity" -m "$f16" -f "$W/heldout.txt" -c $CTX --chunks $CHUNKS --kl-divergence-base "$o/base.kld" \
      > "$o/base.log" 2>&1 || base_ok=0
  else
    base_ok=0
  fi
  "$L/llama-imatrix" -m "$f16" -f "$W/calib.txt" -c $CTX --chunks $CHUNKS -o "$o/ll-imatrix.gguf" > "$o/imatrix.log" 2>&1 \
    || { echo "llama-imatrix failed on $fam (see $o/imatrix.log)" >&2; }
  for t in $TYPES; do
    T=$(echo $t | tr a-z A-Z)
    rm -f "$o/d-$t.gguf" "$o/d-$t-i.gguf" "$o/ll-$t.gguf" "$o/ll-$t-i.gguf"
    "$D" quantize --model "$f16" --output "$o/d-$t.gguf" --type $t --device cpu > "$o/d-$t.log" 2>&1
    "$D" quantize --model "$f16" --output "$o/d-$t-i.gguf" --type $t --device cpu --calibration "$W/calib.txt" \
      --calibration-tokens $((CTX * CHUNKS)) > "$o/d-$t-i.log" 2>&1
    "$L/llama-quantize" "$f16" "$o/ll-$t.gguf" $T > "$o/ll-$t.log" 2>&1
    if [ -f "$o/ll-imatrix.gguf" ]; then
      "$L/llama-quantize" --imatrix "$o/ll-imatrix.gguf" "$f16" "$o/ll-$t-i.gguf" $T > "$o/ll-$t-i.log" 2>&1
    fi
    for v in "" -i; do
      files=("$o/d-$t$v.gguf")
      [ -f "$o/ll-$t$v.gguf" ] && files+=("$o/ll-$t$v.gguf")
      args=(); for f in "${files[@]}"; do args+=(--model "$f"); done
      "$D" eval "${args[@]}" --reference "$f16" --text "$W/heldout.txt" --ctx $CTX --max-tokens $((CTX * CHUNKS)) --json \
        > "$o/eval-$t$v.json" 2> "$o/eval-$t$v.log"
      for f in "${files[@]}"; do
        who=dustoff; [[ $(basename "$f") == ll-* ]] && who=llama.cpp
        ll="- -"; [ $base_ok = 1 ] && ll=$(llkl "$o/base.kld" "$f")
        de=$(python3 - "$o/eval-$t$v.json" "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for m in r["models"]:
    if m["model"] == sys.argv[2]:
        kl = m.get("kl_divergence") or {}
        print(f'{kl.get("mean", float("nan")):.6f} {kl.get("p99", float("nan")):.5f} {100 * m.get("top1_agreement", float("nan")):.2f}%')
        break
else:
    print("? ? ?")
PY
)
        imat=no; [ "$v" = -i ] && imat=yes
        rows+=("| $fam | $t | $imat | $who | ${de// / | } | ${ll// / | } |")
      done
    done
  done
done
echo
echo "| model | type | importance | quantizer | KL mean (dustoff eval) | KL p99 | top-1 agreement | KL mean (llama-perplexity) | KL p99 |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
