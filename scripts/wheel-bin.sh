#!/usr/bin/env bash
# One binary out of a PyPI wheel (no CUDA toolkit): downloads the wheel SPEC once for
# manylinux2014_x86_64, keeps bin/NAME as DIR/NAME, drops the wheel, prints the path.
#   scripts/wheel-bin.sh SPEC NAME DIR    e.g. scripts/wheel-bin.sh nvidia-cuda-nvcc-cu12==12.9.86 ptxas ~/.cache/ptxas/cuda-12.9
set -euo pipefail
spec=$1 name=$2 d=$3
if [ ! -x "$d/$name" ]; then
  mkdir -p "$d"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 "$spec" -d "$d" >&2
  python3 - "$d" "$name" <<'PY'
import glob, os, sys, zipfile
d, name = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(d, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(n for n in z.namelist() if n.endswith("/bin/" + name))
    with z.open(member) as src, open(os.path.join(d, name), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(d, name), 0o755)
os.remove(whl)
PY
fi
echo "$d/$name"
