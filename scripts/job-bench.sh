#!/usr/bin/env bash
# The nightly job benchmark (issue 29 item 4): a real `dustoff run` over generated documents of
# realistic length (scripts/make-docs.py: ~1,500 +/- 500 tokens each) behind a ~300-token shared
# instruction (scripts/job-bench/nightly.toml), 200 generated each, within --max-gpu-memory 32GB
# (a V100's card on a larger one), on a Qwen3-30B-A3B-shaped Q4_K_M GGUF (`dustoff synth`, random
# weights: llama.cpp's mix); then the same workload through llama.cpp in the same lease.
#
#   dev VM:      bash scripts/job-bench.sh pack          (after cargo build --release; writes .gpu/)
#   GPU machine: bash scripts/job-bench.sh dustoff       (carry .gpu; F16 and 8-bit KV rows)
#                bash scripts/job-bench.sh peer          (same warm machine: builds llama.cpp, its rows and
#                                                         the ratio of each dustoff row of the same cache)
#
# Knobs: JB_RECORDS (1000), JB_SHAPE (qwen3-30b-a3b), JB_CAP (32GB), JB_KV ("f16 q8"),
# JB_KV_ELEMS (K and V values a position of the shape, for the peer's sizing: 49152), JB_PTX
# (another compute_70 PTX folder for `dustoff run`, e.g. a base commit's in an A/B), JB_ARGS
# (more `dustoff run` arguments, e.g. "--max-batch-tokens 2048"), JB_TAG (a name for the rows of
# this run, so that runs with other arguments or DUSTOFF_* switches keep their own files),
# JB_PEER_CT (the peer's cache types: "f16 q8_0"; one per call keeps a call short), JB_BIN (another
# dustoff binary for `dustoff run`, e.g. a base commit's in an A/B; with its own JB_PTX).
# The peer runs `llama-batched-bench` with each sequence's prompt the tokens dustoff computed per
# record (its document; the shared instruction counted as free, as a perfect prompt cache would
# make it) and the most sequences whose KV cache and the weights fit the same cap (its compute
# buffers and CUDA context: 1.5 GB reserved, printed from its log); documents per hour = sequences
# x 3600 / the batch's wall time. That idealizes the peer (equal lengths, no scheduling), so the
# ratio is a lower bound of dustoff's lead.
set -u
cd "$(dirname "$0")/.."
RECORDS=${JB_RECORDS:-1000}; SHAPE=${JB_SHAPE:-qwen3-30b-a3b}; CAP=${JB_CAP:-32GB}
if [ "${1:-}" = pack ]; then
  set -e; mkdir -p .gpu
  strip -o /tmp/jb-dustoff target/release/dustoff; xz -6 -T2 -c /tmp/jb-dustoff > .gpu/dustoff.xz
  lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70
  LD_LIBRARY_PATH=$lib target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70 >/dev/null
  tar -C /tmp -cf - ptx70 | xz -6 -T2 > .gpu/ptx70.tar.xz
  rm -rf .gpu/tok; cp -r /work/shared/testdata/arch/qwen3_moe/hf .gpu/tok; rm -f .gpu/tok/model.safetensors
  # The hybrid shapes' tokenizer (gpu-batched-peer.sh, BP_SHAPES=qwen3.6-35b-a3b).
  rm -rf .gpu/tok35; cp -r /work/shared/testdata/arch/qwen3_5_moe/hf .gpu/tok35; rm -f .gpu/tok35/model.safetensors
  python3 scripts/make-docs.py "$RECORDS" | xz -6 -T2 > .gpu/docs.jsonl.xz
  rm -rf .gpu/peer; cp -r ../shared/peer .gpu/peer
  git log -1 --format='%h %s' > .gpu/commit; du -sh .gpu; exit 0
fi
W=$HOME/jb; mkdir -p $W
B=$W/dustoff; F=$W/$SHAPE.gguf
echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ -x $B ] || { xz -dc .gpu/dustoff.xz > $B; chmod +x $B; }
[ -d $W/ptx70 ] || tar -C $W -xJf .gpu/ptx70.tar.xz
[ -f $W/docs.jsonl ] || xz -dc .gpu/docs.jsonl.xz > $W/docs.jsonl
if [ ! -f $F ]; then
  t=$(date +%s)
  $B synth --shape $SHAPE --type q4_k_m --tokenizer .gpu/tok --output $F --force 2>&1 | tail -1
  echo "synth $(( $(date +%s)-t )) s"
fi

# One line of the table from a run's report.
row() { python3 - "$@" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); e = r["engine"]; kv = sys.argv[2]
n, wall = r["counts"]["ok"], r["wall_seconds"]; t = r["tokens"]; b = e.get("step_bound") or {}
print(f"dustoff {kv}: {n} records in {wall:.1f} s = {n * 3600 / wall:,.0f} documents/hour; "
      f"prompt {t['prompt_total'] / wall:,.0f} tok/s ({t['prompt_computed']} computed of {t['prompt_total']}), "
      f"generated {t['generated'] / wall:,.0f} tok/s; slots {e['slots']}, mean running {e['avg_running']:.1f}, "
      f"preemptions {e['preemptions']}; peak {(e.get('peak_device_bytes') or 0) / 1e9:.2f} GB; "
      f"steps at {100 * b.get('share', 0):.1f}% of their bound ({b.get('steps', 0)} steps, "
      f"weights {b.get('weight_gb_per_step', 0):.2f} GB + KV {b.get('kv_gb_per_step', 0):.2f} GB a step)")
v100 = b.get("v100_bound_seconds") or 0
if v100 > 0:
    print(f"  on a V100 at its peak rates (900 GB/s, 125 TFLOP/s) these steps take at least {v100:.1f} s: "
          f"at most {n * 3600 / v100:,.0f} documents/hour for this job")
PY
}

if [ "${1:-}" = dustoff ]; then
  tag=${JB_TAG:-}
  for kv in ${JB_KV:-f16 q8}; do
    t=$(date +%s)
    # shellcheck disable=SC2086 # JB_ARGS is a list of arguments
    ${JB_BIN:-$B} run scripts/job-bench/nightly.toml --input $W/docs.jsonl --output $W/out-$kv$tag.jsonl --model $F \
      --device cuda --ptx-dir ${JB_PTX:-$W/ptx70} --max-gpu-memory $CAP --kv-cache $kv --restart --quiet ${JB_ARGS:-} \
      > $W/run-$kv$tag.log 2>&1
    echo "run --kv-cache $kv ${JB_ARGS:-}: rc $? in $(( $(date +%s)-t )) s"; grep -E "^(slots|KV cache|backend|device|engine):" $W/run-$kv$tag.log | cut -c1-300
    cp $W/out-$kv$tag.jsonl.report.json $OUT/report-$kv$tag.json 2>/dev/null
  done
  for kv in ${JB_KV:-f16 q8}; do row $W/out-$kv$tag.jsonl.report.json "$kv$tag"; done
  exit 0
fi

if [ "${1:-}" = peer ]; then
  L=$HOME/llamacpp/build/bin
  if [ ! -x $L/llama-batched-bench ]; then
    t=$(date +%s); bash .gpu/peer/build-llamacpp.sh > /dev/null 2>&1; echo "llama.cpp built in $(( $(date +%s)-t )) s"
  fi
  rep=$W/out-f16.jsonl.report.json
  npp=${JB_NPP:-$(python3 -c "import json; r=json.load(open('$rep')); print(round(r['tokens']['prompt_computed'] / r['counts']['ok']))")}
  ntg=200; ctx=$(( npp + ntg )); size=$(stat -c %s $F)
  # K and V values a position: layers x 2 x KV heads x head size (Qwen3-30B-A3B: 48 x 2 x 4 x 128).
  elems=${JB_KV_ELEMS:-49152}
  for ct in ${JB_PEER_CT:-f16 q8_0}; do
    per=$([ $ct = f16 ] && echo $(( elems * 2 )) || echo $(( elems * 34 / 32 )))
    n=$(python3 -c "print(int((32e9 - $size - 1.5e9) // ($ctx * $per)))")
    t=$(date +%s)
    $L/llama-batched-bench -m $F -ngl 99 -fa on -c $(( n * ctx )) -b 2048 -ub 512 -ctk $ct -ctv $ct \
      -npp $npp -ntg $ntg -npl $n > $W/peer-$ct.log 2>&1
    echo "llama-batched-bench -ctk/-ctv $ct -npp $npp -ntg $ntg -npl $n: rc $? in $(( $(date +%s)-t )) s"
    grep -E "KV buffer size|compute buffer size|model buffer size" $W/peer-$ct.log | head -4
    cp $W/peer-$ct.log $OUT/ 2>/dev/null
    # The peer's row, and the ratio of dustoff's rows on this machine to it (JB_TAG rows included).
    python3 - $W/peer-$ct.log $ct $n $W <<'PY'
import glob, json, os, sys
rows = [l.split("|") for l in open(sys.argv[1]) if l.startswith("|") and l.split("|")[1].strip().isdigit()]
ct, w = sys.argv[2], sys.argv[4]
for r in rows:
    c = [x.strip() for x in r[1:-1]]
    # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
    b, t_all = int(c[2]), float(c[8])
    peer = b * 3600 / t_all
    print(f"llama.cpp {ct:>4}: {b} sequences in {t_all:.1f} s = {peer:,.0f} documents/hour; "
          f"prompt {c[5]} tok/s, generated {c[7]} tok/s")
    # Against the F16 peer (its fastest cache): every dustoff row; against q8_0: the q8 rows.
    pat = "out-*" if ct == "f16" else "out-q8*"
    for rep in sorted(glob.glob(f"{w}/{pat}.jsonl.report.json")):
        d = json.load(open(rep))
        ours = d["counts"]["ok"] * 3600 / d["wall_seconds"]
        tag = os.path.basename(rep)[len("out-"):-len(".jsonl.report.json")]
        print(f"  dustoff {tag}: {ours:,.0f} documents/hour = {ours / peer:.2f}x llama.cpp {ct}")
PY
  done
  exit 0
fi
echo "usage: $0 pack | dustoff | peer" >&2; exit 2
