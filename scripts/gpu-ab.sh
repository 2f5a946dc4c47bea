# What the A/B scripts against an earlier commit's PTX share (sourced by scripts/gpu-stage16.sh
# and scripts/gpu-moe-mma.sh, from the repository root).
#   `ab_pack`: on the dev VM, after cargo build --release and cargo test --release --no-run:
#     .gpu gets gpu-route-flips.sh's pack (gp, ptx70 of this commit, test data), the stripped
#     dustoff and BASE_PTX (the base commit's ptx70 tarball).
#   `ab_unpack`: on the GPU machine: S=$HOME/st holds gp, ptx70, base/ptx70 and dustoff; L is
#     where logs go ($OUT when set: kept if the call times out); PTX[base] / PTX[new] the folders.
ab_pack() {
  set -e; bash scripts/gpu-route-flips.sh pack >/dev/null
  strip -o /tmp/ab-dustoff target/release/dustoff; xz -6 -T2 -c /tmp/ab-dustoff > .gpu/dustoff.xz
  cp "${BASE_PTX:?the base commit\'s ptx70 tarball}" .gpu/ptx70-base.tar.xz
  du -sh .gpu
}
# `ab_pack_job`: ab_pack, then scripts/job-bench.sh's pack (JB_RECORDS documents, 600 unless set).
ab_pack_job() { ab_pack; JB_RECORDS=${JB_RECORDS:-600} bash scripts/job-bench.sh pack; }
ab_unpack() {
  S=$HOME/st; mkdir -p $S/base; L=${OUT:-$S}
  echo "commit $(cat .gpu/commit)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  [ -x $S/gp ] || { xz -dc .gpu/gp.xz > $S/gp; chmod +x $S/gp; tar -C $S -xJf .gpu/ptx70.tar.xz; tar -C $S/base -xJf .gpu/ptx70-base.tar.xz; }
  [ -x $S/dustoff ] || { xz -dc .gpu/dustoff.xz > $S/dustoff; chmod +x $S/dustoff; }
  mkdir -p /work/shared; [ -d /work/shared/testdata/arch ] || tar -C /work/shared -xJf .gpu/td.tar.xz
  export DUSTOFF_REQUIRE_GPU=1 RUST_MIN_STACK=33554432
  declare -gA PTX=([base]=$S/base/ptx70 [new]=$S/ptx70)
}
