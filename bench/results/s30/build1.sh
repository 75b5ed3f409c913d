#!/bin/bash
# x1 for bench/results/s30/run2.sh: the checked-out tree with kDecodeMatrixSteps = true and
# kDecodeMatrixOneToken = true (fixed batches of one token a step on the matrix step too, bf16 pools
# in their two passes); packed into build-s30/s30b.tar.xz.
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s30
rm -rf /tmp/s30_x1 && mkdir -p /tmp/s30_x1 $B/x1
git ls-files -z | (cd $ROOT && xargs -0 cp --parents -t /tmp/s30_x1)
H=/tmp/s30_x1/src/cuda/sm90/kda_decode_sm90.cuh
sed -i 's/inline constexpr bool kDecodeMatrixSteps = false;/inline constexpr bool kDecodeMatrixSteps = true;/' $H
sed -i 's/inline constexpr bool kDecodeMatrixOneToken = false;/inline constexpr bool kDecodeMatrixOneToken = true;/' $H
grep -q "kDecodeMatrixOneToken = true" $H
grep -q "kDecodeMatrixSteps = true" $H
cmake -S /tmp/s30_x1 -B $B/src_x1 -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=ON -DFLASH_KDA_BUILD_BENCH=ON \
  -DFLASH_KDA_BUILD_EXAMPLES=OFF > $B/src_x1.cfg.log
cmake --build $B/src_x1 -j2 --target kda_bench test_cuda_decode > $B/src_x1.build.log
for t in kda_bench test_cuda_decode; do cp "$(find $B/src_x1 -name $t -type f -perm -u+x | head -1)" $B/x1/; done
strip $B/x1/*
rm -rf /tmp/s30_x1
XZ_OPT=-9e tar -cJf $B/s30b.tar.xz -C $B x1
ls -la $B/s30b.tar.xz
