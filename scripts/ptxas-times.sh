#!/usr/bin/env bash
# What a first start costs per PTX module on a V100 box: the driver JIT-compiles every compute_70
# module it loads with its release's ptxas, so the time CUDA 12.9's ptxas takes for -arch=sm_70
# on this machine's one core stands for that module's share of the first start (the JIT is
# cached afterwards). Prints seconds, PTX bytes and entries per module, slowest first, and the
# total; with FORMATS (e.g. "q4_k q6_k") also the entries a model of those formats keeps (a backend
# loads each module cut to them: compile::model_entries) and their share of the module's time (an
# estimate from entry counts: entries differ); HEAD (e.g. 128) leaves out the attention entries of
# other head sizes too, as a backend of that head size does.
#   bash scripts/ptxas-times.sh                 (builds the PTX with dustoff kernels; PTX_DIR to reuse one)
set -euo pipefail
cd "$(dirname "$0")/.."
p12=$(scripts/wheel-bin.sh nvidia-cuda-nvcc-cu12==12.9.86 ptxas "${PTXAS_DIR:-$HOME/.cache/ptxas}/cuda-12.9")
ptx=${PTX_DIR:-}
if [ -z "$ptx" ]; then
  ptx=$(mktemp -d); trap 'rm -rf "$ptx"' EXIT
  scripts/ptx70.sh "$ptx"
fi
times=$(for f in "$ptx"/*.ptx; do
  s=$(date +%s.%N); "$p12" -arch=sm_70 -O3 -o /dev/null "$f"; e=$(date +%s.%N)
  echo "$(basename "$f" .ptx) $(echo "$e - $s" | bc) $(stat -c %s "$f")"
done)
FORMATS="${FORMATS:-}" HEAD="${HEAD:-}" python3 - "$ptx" "$times" <<'PY'
import os, re, sys
ptx, times = sys.argv[1], sys.argv[2]
ALL = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"]
fmts = os.environ["FORMATS"].split()
def entries(m):
    return re.findall(r"^\.visible \.entry (\w+)", open(f"{ptx}/{m}.ptx").read(), re.M)
head_size = os.environ.get("HEAD", "")
def other(n):
    # Named for a quantized format other than the model's, or (HEAD) another head size.
    if any(re.search(rf"_{f}(_|$)", n) for f in ALL if f not in fmts):
        return True
    m = re.search(r"_hd(\d+)(_|$)", n)
    return bool(head_size and m and m.group(1) != head_size)
def kept(names):
    return [n for n in names if not other(n)]
rows = sorted((l.split() for l in times.splitlines()), key=lambda r: -float(r[1]))
head = "| module | ptxas -arch=sm_70 s | PTX MB | entries |"
if fmts:
    head += f" entries for {' '.join(fmts)}{' hd' + head_size if head_size else ''} | their share of the s |"
print(head)
print("|---" * (head.count("|") - 1) + "|")
tot = est = 0.0
for m, t, b in rows:
    names = entries(m)
    t = float(t)
    tot += t
    line = f"| {m} | {t:.1f} | {int(b) / 1e6:.2f} | {len(names)} |"
    if fmts:
        k = len(kept(names))
        e = t * k / max(len(names), 1)
        est += e
        line += f" {k} | {e:.1f} |"
    print(line)
line = f"| all {len(rows)} | {tot:.1f} | {sum(int(r[2]) for r in rows) / 1e6:.2f} | |"
print(line + (f" | {est:.1f} |" if fmts else ""))
PY
