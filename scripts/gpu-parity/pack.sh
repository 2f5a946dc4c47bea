#!/usr/bin/env bash
# Packs the tree's binaries for the two integration calls: .gpu-a (binaries, PTX, test data,
# model part 1) and .gpu-b (model part 2). After cargo test --release --no-run; then on the GPU machine,
# back to back (the second call needs the first one's ~/st): bash .gpu-a/a.sh (carry .gpu-a), bash .gpu-b/b.sh (carry .gpu-b).
# The sample model travels xz-compressed in two parts: one call carries at most 64 MiB with the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu-a .gpu-b; mkdir -p .gpu-a .gpu-b
gp=$(ls -t target/release/deps/gpu_parity-* | grep -v '\.d$' | head -1)
strip -o /tmp/gp "$gp"; xz -6 -T2 -c /tmp/gp > .gpu-a/gp.xz
strip -o /tmp/dz target/release/dustoff; xz -6 -T2 -c /tmp/dz > .gpu-a/dustoff.xz
lib=$(bash scripts/nvrtc12.sh); rm -rf /tmp/ptx70; LD_LIBRARY_PATH=$lib target/release/dustoff kernels --arch compute_70 --out /tmp/ptx70 >/dev/null
tar -C /tmp -cf - ptx70 | xz -6 -T2 > .gpu-a/ptx70.tar.xz
tar -C /work/shared -cf - testdata/arch testdata/smollm2 | xz -6 -T2 > .gpu-a/td.tar.xz
m=samples/models/SmolLM2-135M-Instruct.Q4_1.gguf
xz -6 -T2 -c $m > /tmp/m.xz; head -c 32000000 /tmp/m.xz > .gpu-a/m1; tail -c +32000001 /tmp/m.xz > .gpu-b/m2
sha256sum $m | cut -d' ' -f1 > .gpu-b/m.sha
git log -1 --format='%h %s' > .gpu-a/commit
cp scripts/gpu-parity/a.sh .gpu-a/; cp scripts/gpu-parity/b.sh .gpu-b/
du -sb .gpu-a .gpu-b
