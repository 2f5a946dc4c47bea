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
# (never over a real checkout of that name, as on the development machine)
[ -d /work/wt-quant14 ] && [ ! -L /work/wt-quant14 ] || ln -sfn "$T/wt" /work/wt-quant14
left() { echo $((150 - SECONDS)); }

echo; echo "== parity: CUDA activation tap vs CPU, and the forward-pass tests around it (native)"
export DUSTOFF_REQUIRE_GPU=1
timeout 45 "$T/gpu_parity" --test-threads 1 --nocapture calibrate sample_model graph_replay 2>&1 | grep -E "calibration_imatrix|test result|panicked|FAILED|SKIPPED" | head -20
echo; echo "== parity: CUDA activation tap vs CPU (compute_70 PTX)"
DUSTOFF_PTX_DIR=$T/ptx70 timeout 30 "$T/gpu_parity" --test-threads 1 --nocapture calibrate 2>&1 | grep -E "calibration_imatrix|test result|panicked|FAILED|PTX" | head -20
unset DUSTOFF_REQUIRE_GPU

echo; echo "== quantize on this machine from the Q4_1 sample model (each timed 3x, median in ms)   [$(left) s left]"
med() { sort -n | sed -n 2p; }
# tq NAME ARGS...: quantize the F16 reference 3 times; the first output is kept as NAME.gguf
# (its summary printed), the median wall time in ms goes to stdout's last line.
tq() {
  local name=$1; shift
  for i in 1 2 3; do
    local o="$W/t.gguf"; [ $i = 1 ] && o="$W/$name.gguf"
    rm -f "$o"; local s=$(date +%s%N)
    "$D" quantize --model "$W/f16.gguf" --output "$o" "$@" > "$W/$name.log$i" 2>&1 || { echo "$name FAILED:" >&2; tail -4 "$W/$name.log$i" >&2; }
    echo $(( ($(date +%s%N) - s) / 1000000 ))
  done | med
  grep -E "^(wrote|calibration|[0-9]+ tensor)" "$W/$name.log1" >&2
}
echo "-- dustoff convert --model $SRC --output f16.gguf --dtype f16"
"$D" convert --model "$SRC" --output "$W/f16.gguf" --dtype f16 2>&1 | grep -E "^wrote|rror"
TQ8=$(tq q8_0 --type q8_0)
TQ=$(tq q4_k_m --type q4_k_m)
CAL="--calibration $G/texts/calib.txt --calibration-tokens 4096"
TG=$(tq q4_k_m-cal-cuda --type q4_k_m --device cuda $CAL)
TC=$(tq q4_k_m-cal-cpu --type q4_k_m --device cpu $CAL)
echo "q8_0 $TQ8 ms; q4_k_m $TQ ms; q4_k_m + 4,096 calibration tokens on cuda $TG ms, on cpu ($(nproc) cores) $TC ms"
echo "-- quantize --pipeline summarize --calibration samples/news.jsonl --device cuda --verify"
"$D" quantize --model "$W/f16.gguf" --output "$W/q4_k_m-pipe-cuda.gguf" --type q4_k_m --device cuda \
  --pipeline summarize --calibration samples/news.jsonl --verify 2>&1 | grep -vE "^\s*$" | tail -6

echo; echo "== generate --device cuda vs --device cpu, same file, same greedy command"
GEN=""
for f in q8_0 q4_k_m q4_k_m-cal-cuda; do
  for dev in cuda cpu; do
    timeout 40 "$D" generate --model "$W/$f.gguf" --input "$G/texts/prompts.jsonl" --output "$W/gen-$f-$dev.jsonl" \
      --max-tokens 48 --device $dev > "$W/gen-$f-$dev.log" 2>&1 || { echo "$f $dev FAILED:"; tail -5 "$W/gen-$f-$dev.log"; }
  done
  grep -E "device|matrices" "$W/gen-$f-cuda.log" | head -2
  if [ ! -s "$W/gen-$f-cuda.jsonl" ] || [ ! -s "$W/gen-$f-cpu.jsonl" ]; then r="FAILED (no output)"
  elif cmp -s "$W/gen-$f-cuda.jsonl" "$W/gen-$f-cpu.jsonl"; then r="identical"
  else r="DIFFERENT"; diff "$W/gen-$f-cuda.jsonl" "$W/gen-$f-cpu.jsonl" | head -6; fi
  n=$(cat "$W/gen-$f-cuda.jsonl" 2>/dev/null | wc -l)
  echo "$f: $n outputs on cuda, cuda vs cpu $r"; head -c 300 "$W/gen-$f-cuda.jsonl" 2>/dev/null; echo
  GEN="$GEN| generate $f.gguf (3 prompts x 48 tokens, greedy) | $n rows; cuda vs cpu output: $r |\n"
done

echo; echo "== quality: the GPU- and CPU-calibrated files against the F16 reference (held-out text)   [$(left) s left]"
MODELS=""
for f in q8_0 q4_k_m q4_k_m-cal-cpu q4_k_m-cal-cuda q4_k_m-pipe-cuda; do [ -s "$W/$f.gguf" ] && MODELS="$MODELS --model $W/$f.gguf"; done
[ "$(left)" -gt 25 ] && timeout $(( $(left) - 8 )) "$D" eval --reference "$W/f16.gguf" $MODELS \
  --text "$G/texts/heldout.txt" --ctx 512 --max-tokens 4096 2>&1 | tail -8

echo; echo "== summary"
echo "| check | result |"
echo "|---|---|"
printf "$GEN"
for f in q4_k_m-cal-cuda q4_k_m-pipe-cuda; do [ -s "$W/$f.gguf" ] || echo "| quantize $f (calibration on cuda) | FAILED |"; done
echo "| quantize q8_0 / q4_k_m, no calibration (wall, median of 3) | $TQ8 ms / $TQ ms |"
echo "| quantize q4_k_m + 4,096 calibration tokens, on cuda / on cpu (wall, median of 3) | $TG ms / $TC ms |"
echo "total $SECONDS s"
