#!/usr/bin/env bash
# Checks an offline bundle (scripts/bundle.sh) as the server would use it: unpacks the tarball
# into a temporary folder, verifies SHA256SUMS, checks the binary's glibc requirement, then from
# another working folder and with a clean environment (no LD_LIBRARY_PATH, no DUSTOFF_*, a fresh
# HOME) runs `dustoff --version`, `dustoff doctor` (exit 0, kernels from the bundle's ptx/,
# cuBLAS found when the bundle has lib/) and the summarize job on the bundled model and input.
#   scripts/bundle-check.sh TARBALL [--device cpu|cuda] [--compare BINARY]
# --compare: the same job by another binary (e.g. target/release/dustoff, on the CPU) must write
# byte-identical rows. --device cuda (a GPU machine) keeps LD_LIBRARY_PATH, where the driver may be.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: $0 TARBALL [--device cpu|cuda] [--compare BINARY]" >&2; exit 2; }
[ $# -ge 1 ] || usage
tarball=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
device=cpu
compare=
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --device) device=$2 ;;
    --compare) compare=$(cd "$(dirname "$2")" && pwd)/$(basename "$2") ;;
    *) usage ;;
  esac
  shift 2
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/server" "$tmp/work" "$tmp/home"
tar -C "$tmp/server" -xzf "$tarball"
b=$(echo "$tmp"/server/*/)
b=${b%/}
[ -x "$b/dustoff" ] || { echo "$tarball: no dustoff binary in its folder" >&2; exit 1; }
(cd "$b" && sha256sum -c --quiet SHA256SUMS)
echo "checksums: $(wc -l < "$b/SHA256SUMS") files OK"
if [ "$device" = cuda ] && ! command -v objdump >/dev/null; then
  echo "objdump missing: glibc check skipped on this GPU machine (CI makes it)"
else
  "$repo/scripts/release.sh" --check "$b/dustoff"
fi
model=$(ls "$b/models" | head -n 1)

keep=()
[ "$device" = cuda ] && keep=("LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
clean() { (cd "$tmp/work" && env -i PATH=/usr/bin:/bin HOME="$tmp/home" "${keep[@]}" "$@"); }

clean "$b/dustoff" --version
clean "$b/dustoff" doctor --no-measure
clean "$b/dustoff" doctor --json --no-measure > "$tmp/doctor.json"
python3 - "$tmp/doctor.json" "$b" <<'EOF'
import json, os, sys
d = json.load(open(sys.argv[1]))
b = sys.argv[2]
want = f"PTX from {os.path.join(b, 'ptx')}"
assert d["cuda"]["kernels"] == want, f"doctor: kernels {d['cuda']['kernels']!r}, expected {want!r}"
if os.path.isdir(os.path.join(b, "lib")):
    assert d["cuda"]["cublas_loadable"], "doctor: the bundle's lib/ cuBLAS was not found"
print(f"doctor: {d['cuda']['kernels']}; cuBLAS {'found' if d['cuda']['cublas_loadable'] else 'not found'}; usable {d['usable_devices']}")
EOF

clean "$b/dustoff" run "$b/pipelines/summarize.toml" --model "$b/models/$model" --input "$b/samples/news.jsonl" \
  --output "$tmp/work/out/summaries.jsonl" --device "$device" --quiet
rows=$(wc -l < "$tmp/work/out/summaries.jsonl")
[ "$rows" -eq "$(wc -l < "$b/samples/news.jsonl")" ] || { echo "the job wrote $rows rows" >&2; exit 1; }
echo "run: $rows rows from the bundle ($device)"
if [ -n "$compare" ]; then
  (cd "$repo" && "$compare" run "$b/pipelines/summarize.toml" --model "$b/models/$model" \
    --input "$b/samples/news.jsonl" --output "$tmp/compare.jsonl" --device cpu --quiet)
  cmp "$tmp/work/out/summaries.jsonl" "$tmp/compare.jsonl" \
    || { echo "the bundle's rows differ from those of $compare" >&2; exit 1; }
  echo "rows identical to those of $compare (cpu)"
fi
head -n 2 "$tmp/work/out/summaries.jsonl"
echo "bundle OK: $tarball"
