#!/bin/bash
# (Ran at be450b1, where the streaming flags existed; main dropped them at ae07a3e: check out be450b1 to rebuild.)
# Builds what bench/results/s31/run2.sh runs, on the development machine (no GPU), from the
# checked-out tree in build-m (configured with tests and benchmarks): s = streaming CTAs on for the
# two-pass kernels (kDecodeStreamMatrix, kDecodeStreamOneToken) and fp32 pools in two passes of 2 rows
# (kDecodeStreamFp32), r = the tree as committed (streaming off: the refactored kernel); stripped, packed into build-s31/s31.tar.xz. The tree is restored.
#   bash bench/results/s31/build.sh      (from the repository root)
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s31
H=src/cuda/sm90/kda_decode_sm90.cuh
mkdir -p $B/s $B/r
cp $H /tmp/s31_keep.cuh
trap 'cp /tmp/s31_keep.cuh $ROOT/$H' EXIT
sed -i 's/inline constexpr bool kDecodeStreamMatrix = false;/inline constexpr bool kDecodeStreamMatrix = true;/;
        s/inline constexpr bool kDecodeStreamOneToken = false;/inline constexpr bool kDecodeStreamOneToken = true;/;
        s/inline constexpr bool kDecodeStreamFp32 = false;/inline constexpr bool kDecodeStreamFp32 = true;/' $H
grep -q "kDecodeStreamMatrix = true" $H && grep -q "kDecodeStreamOneToken = true" $H && grep -q "kDecodeStreamFp32 = true" $H
T="kda_bench test_cuda_decode test_cuda_sanitize"
cmake --build build-m -j2 --target $T > $B/s.build.log
for t in $T; do cp "$(find build-m -name $t -type f -perm -u+x | head -1)" $B/s/; done
cp /tmp/s31_keep.cuh $H
cmake --build build-m -j2 --target kda_bench > $B/r.build.log
cp "$(find build-m -name kda_bench -type f -perm -u+x | head -1)" $B/r/
strip $B/s/* $B/r/*
XZ_OPT=-9e tar -cJf $B/s31.tar.xz -C $B s r
ls -la $B/s31.tar.xz
