#!/bin/bash
# Device check of `dustoff quantize` (issue 14): files quantized ON the GPU machine from the
# sample model must run `generate --device cuda` and give the CPU backend's text; calibration on
# the GPU (the CUDA activation tap) against the CPU's; the tap's parity test natively and from
# compute_70 PTX. Run from the root of a copy of the repo: bash .gpu-quant14/run.sh (writes
# $OUT/quant14.txt, <= 150 s). The folder holds dustoff.gz, gpu_parity.gz (stripped, gzipped
# builds), ptx70.tar.gz (`dustoff kernels --arch compute_70`, NVRTC 12.9) and texts/ (calib.txt,
# heldout.txt: Debian 12 license and vim help files, prompts.jsonl).
set -u
G=${G:-$PWD/.gpu-quant14}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/quant14.txt") 2>&1
echo "== quant14 GPU run $(date -u) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
T=$G/t
W=$T/work
mkdir -p "$T" "$W"
gunzip -c "$G/dustoff.gz" > "$T/dustoff" && gunzip -c "$G/gpu_parity.gz" > "$T/gpu_parity" && chmod +x "$T/dustoff" "$T/gpu_parity"
tar -xzf "$G/ptx70.tar.gz" -C "$T"   # -> $T/ptx70/*.ptx
D=$T/dustoff
M=samples/models/SmolLM2-135M-Instruct.Q4_1.gguf
SRC=""
for c in .gpu-sample/SmolLM2-135M-Instruct.Q4_1.gguf "$M" ~/keep/SmolLM2-135M-Instruct.Q4_1.gguf; do
  if [ -s "$c" ]; then SRC=$(readlink -f "$c"); break; fi
done
if [ -z "$SRC" ]; then echo "sample model NOT FOUND: nothing to check"; exit 1; fi
echo "sample model: $SRC sha256 $(sha256sum "$SRC" | cut -c1-16)"
# The test binary's CARGO_MANIFEST_DIR is /work/wt-quant14: the sample model goes under it.
mkdir -p "$T/wt/samples/models" /work
ln -sfn "$SRC" "$T/wt/$M"
ln -sfn "$PWD/tests" "$T/wt/tests"
ln -sfn "$T/wt" /work/wt-quant14
left() { echo $((150 - SECONDS)); }

echo; echo "== parity: CUDA activation tap vs CPU (native), then the whole suite (native)"
export DUSTOFF_REQUIRE_GPU=1
timeout 40 "$T/gpu_parity" --test-threads 1 calibrate 2>&1 | grep -E "calibration_imatrix|test result|panicked|FAILED|SKIPPED" | head -20
timeout 60 "$T/gpu_parity" --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head -20
echo; echo "== parity: CUDA activation tap vs CPU (compute_70 PTX)"
DUSTOFF_PTX_DIR=$T/ptx70 timeout 40 "$T/gpu_parity" --test-threads 1 calibrate 2>&1 | grep -E "calibration_imatrix|test result|panicked|FAILED|PTX" | head -20
unset DUSTOFF_REQUIRE_GPU

echo; echo "== quantize on this machine (from the Q4_1 sample model: F16 reference, q8_0, q4_k_m)"
q() { echo "-- dustoff $*"; "$D" "$@" 2>&1 | grep -vE "^\s*$" | tail -4; }
q convert --model "$SRC" --output "$W/f16.gguf" --dtype f16
q quantize --model "$W/f16.gguf" --output "$W/q8_0.gguf" --type q8_0
q quantize --model "$W/f16.gguf" --output "$W/q4_k_m.gguf" --type q4_k_m
q quantize --model "$W/f16.gguf" --output "$W/q4_k_m-cal-cuda.gguf" --type q4_k_m --device cuda \
  --calibration "$G/texts/calib.txt" --calibration-tokens 8192 --imatrix-out "$W/im-cuda.gguf"
q quantize --model "$W/f16.gguf" --output "$W/q4_k_m-cal-cpu.gguf" --type q4_k_m --device cpu \
  --calibration "$G/texts/calib.txt" --calibration-tokens 8192 --imatrix-out "$W/im-cpu.gguf"
q quantize --model "$W/f16.gguf" --output "$W/q4_k_m-pipe-cuda.gguf" --type q4_k_m --device cuda \
  --pipeline summarize --calibration samples/news.jsonl --verify

echo; echo "== generate --device cuda vs --device cpu, same file, same greedy command"
GEN=""
for f in q8_0 q4_k_m q4_k_m-cal-cuda; do
  for dev in cuda cpu; do
    timeout 40 "$D" generate --model "$W/$f.gguf" --input "$G/texts/prompts.jsonl" --output "$W/gen-$f-$dev.jsonl" \
      --max-tokens 48 --device $dev > "$W/gen-$f-$dev.log" 2>&1 || { echo "$f $dev FAILED:"; tail -5 "$W/gen-$f-$dev.log"; }
  done
  grep -E "device|matrices" "$W/gen-$f-cuda.log" | head -2
  if cmp -s "$W/gen-$f-cuda.jsonl" "$W/gen-$f-cpu.jsonl"; then r="identical"; else r="DIFFERENT"; diff "$W/gen-$f-cuda.jsonl" "$W/gen-$f-cpu.jsonl" | head -6; fi
  n=$(wc -l < "$W/gen-$f-cuda.jsonl" 2>/dev/null || echo 0)
  echo "$f: $n outputs, cuda vs cpu $r"; head -c 300 "$W/gen-$f-cuda.jsonl"; echo
  GEN="$GEN\n| generate $f (3 prompts x 48 tokens) | cuda vs cpu: $r |"
done

echo; echo "== quantize and calibration time (median of 3, ms)   [$(left) s left]"
med() { sort -n | sed -n 2p; }
tq() {   # tq ARGS...: ms of one quantize run from the F16 reference, median of 3
  for i in 1 2 3; do
    rm -f "$W/t.gguf"; s=$(date +%s%N)
    "$D" quantize --model "$W/f16.gguf" --output "$W/t.gguf" --type q4_k_m "$@" > /dev/null 2>&1
    echo $(( ($(date +%s%N) - s) / 1000000 ))
  done | med
}
TQ=$(tq)
TG=$(tq --device cuda --calibration "$G/texts/calib.txt" --calibration-tokens 8192)
TC=$(tq --device cpu --calibration "$G/texts/calib.txt" --calibration-tokens 8192)
echo "quantize q4_k_m without calibration: $TQ ms; with 8,192 calibration tokens on cuda: $TG ms; on cpu ($(nproc) cores): $TC ms"

echo; echo "== quality: the GPU- and CPU-calibrated files against the F16 reference (held-out text)   [$(left) s left]"
timeout $(( $(left) - 10 )) "$D" eval --reference "$W/f16.gguf" --model "$W/q8_0.gguf" --model "$W/q4_k_m.gguf" \
  --model "$W/q4_k_m-cal-cpu.gguf" --model "$W/q4_k_m-cal-cuda.gguf" --text "$G/texts/heldout.txt" --ctx 512 --max-tokens 4096 2>&1 | tail -7

echo; echo "== summary"
echo "| check | result |"
echo "|---|---|"
printf "$GEN\n"
echo "| quantize q4_k_m, no calibration (median of 3) | $TQ ms |"
echo "| quantize q4_k_m + calibration 8,192 tokens, cuda / cpu (median of 3) | $TG ms / $TC ms |"
echo "total $SECONDS s"
