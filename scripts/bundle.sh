#!/usr/bin/env bash
# Makes an offline install bundle for a server with no network and no CUDA toolkit (e.g. a V100
# box): a folder and a .tar.gz of it holding
#   dustoff             the glibc-2.17 binary (scripts/release.sh)
#   ptx/                every kernel as compute_70 PTX (`dustoff kernels`, NVRTC 12 from
#                       scripts/nvrtc12.sh); the binary reads ptx/ beside itself, no NVRTC needed
#   lib/                only with `--cublas 11` (drivers R460+: dustoff needs CUDA 11.2) or `--cublas 12` (R525+): cuBLAS
#                       from its PyPI wheel (cuBLAS 11: 638 MB), found through the binary's $ORIGIN/lib
#                       RUNPATH; faster prompts. Without it (the default) prefill runs on
#                       dustoff's own tensor-core GEMM: only the driver is needed
#   pipelines/          the pipeline definitions
#   models/MODEL        the model (`--model PATH`, a GGUF file or an HF folder; default: the sample model)
#   samples/news.jsonl  a 12-record input to try a job on
#   INSTALL.txt         what to run on the server
#   SHA256SUMS          sha256sum -c SHA256SUMS checks every file above
# Run on a machine with network, from the repository:
#   scripts/bundle.sh [--model PATH] [--cublas 11|12|none] [--binary FILE] [--out DIR]
# The last line printed is the tarball's path.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

CUBLAS11=nvidia-cublas-cu11==11.11.3.6   # CUDA 11.8's cuBLAS: R450+ drivers (CUDA 11 minor-version compatibility)
CUBLAS12=nvidia-cublas-cu12==12.9.1.4    # CUDA 12.9's cuBLAS: R525+ drivers

usage() { echo "usage: $0 [--model PATH] [--cublas 11|12|none] [--binary FILE] [--out DIR]" >&2; exit 2; }
model=samples/models/SmolLM2-135M-Instruct.Q4_1.gguf
cublas=none
binary=
out=dist
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --model) model=$2 ;;
    --cublas) cublas=$2 ;;
    --binary) binary=$2 ;;
    --out) out=$2 ;;
    *) usage ;;
  esac
  shift 2
done
case "$cublas" in 11|12|none) ;; *) echo "--cublas must be 11, 12 or none, not '$cublas'" >&2; exit 2 ;; esac

if [ "$model" = samples/models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  samples/fetch-model.sh >&2
fi
[ -e "$model" ] || { echo "model not found: $model" >&2; exit 1; }
if [ -z "$binary" ]; then
  binary=$(scripts/release.sh | tail -n 1)
else
  scripts/release.sh --check "$binary" >&2
fi

version=$("$binary" --version | awk '{print $2}')
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
name=dustoff-$version-x86_64-linux
mkdir -p "$out"
out=$(cd "$out" && pwd)
dest="$out/$name"
rm -rf "$dest" "$dest.tar.gz"
mkdir -p "$dest/models" "$dest/samples"

cp "$binary" "$dest/dustoff"
cp -r pipelines "$dest/pipelines"
cp samples/news.jsonl "$dest/samples/"
cp -r "$model" "$dest/models/"
model_name=$(basename "$model")

# The kernels, compiled for compute_70 by NVRTC 12 (the last NVRTC that targets the V100).
nvrtc=$(scripts/nvrtc12.sh)
LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$dest/dustoff" kernels --arch compute_70 --out "$dest/ptx" >&2

if [ "$cublas" != none ]; then
  spec=$CUBLAS11
  [ "$cublas" = 12 ] && spec=$CUBLAS12
  wheels=${DUSTOFF_WHEEL_DIR:-$HOME/.cache/dustoff-wheels}
  mkdir -p "$wheels" "$dest/lib"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 "$spec" -d "$wheels" >&2
  wheel=$(ls "$wheels"/"$(echo "${spec%%==*}" | tr - _)"-"${spec##*==}"-*.whl | head -n 1)
  # Only libcublas and libcublasLt (what dustoff loads), and the licence that comes with them.
  python3 - "$wheel" "$dest/lib" <<'EOF'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if os.path.basename(n).startswith(("libcublas.so.", "libcublasLt.so."))]
if len(names) != 2:
    sys.exit(f"{sys.argv[1]}: expected libcublas and libcublasLt, found {names}")
for n in names:
    with open(os.path.join(sys.argv[2], os.path.basename(n)), "wb") as f:
        f.write(z.read(n))
lic = [n for n in z.namelist() if n.endswith("License.txt") or n.endswith("LICENSE")]
if lic:
    with open(os.path.join(sys.argv[2], "cuBLAS-License.txt"), "wb") as f:
        f.write(z.read(lic[0]))
EOF
fi

cublas_text="lib/ holds cuBLAS $cublas (${spec:-}) for prompt processing; the binary finds it beside itself."
[ "$cublas" = none ] && cublas_text="No cuBLAS here: prompts run on dustoff's own GEMM (a libcublas on LD_LIBRARY_PATH is used when present)."
drivers="Any NVIDIA driver from CUDA 11.2 (R460) up to R580."
[ "$cublas" = 12 ] && drivers="Any NVIDIA driver from CUDA 12.0 (R525) up to R580 (cuBLAS 12 needs R525; bundle with --cublas 11 for R460-R520)."
cat > "$dest/INSTALL.txt" <<EOF
dustoff $version (commit $commit), offline bundle made $(date -u +%Y-%m-%d) for x86_64 Linux with
glibc 2.17 or newer (CentOS/RHEL 7 and later, Ubuntu 14.04 and later).

GPU: compute capability 7.0 (V100) or newer. $drivers
No CUDA toolkit, no NVRTC and no network are needed: the kernels are in ptx/ (compute_70 PTX,
JIT-compiled by the driver on first use) and the binary reads ptx/ beside itself.
$cublas_text

On the server:
  tar -xzf $name.tar.gz && cd $name
  sha256sum -c SHA256SUMS          # every line must say OK
  ./dustoff doctor                 # exit 0; "usable devices" lists cuda:0 on a GPU server
  ./dustoff run pipelines/summarize.toml --model models/$model_name \\
      --input samples/news.jsonl --output out/summaries.jsonl

If doctor says a GPU is not usable, it names the reason: no driver loaded (install or load the
NVIDIA driver: nvidia-smi must work) or a driver older than CUDA 11.2 (R460). The CPU backend
always works (--device cpu). Put dustoff on PATH with a symlink (ln -s \$PWD/dustoff
/usr/local/bin/): it still finds ptx/ and lib/ beside the real file.
EOF

(cd "$dest" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs -d '\n' sha256sum > SHA256SUMS)
tar -C "$out" -czf "$dest.tar.gz" "$name"
echo "bundle: $dest ($(du -sh "$dest" | cut -f1)), $(wc -l < "$dest/SHA256SUMS") files in SHA256SUMS" >&2
echo "$dest.tar.gz"
