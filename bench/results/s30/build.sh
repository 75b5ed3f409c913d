#!/bin/bash
# Builds what bench/results/s30/run2.sh runs, on the development machine (no GPU):
#   m = 33df773 (main with the folded steps on, before the matrix step), x = the checked-out tree with
#   kDecodeMatrixSteps = true; stripped, packed into build-s30/s30.tar.xz. ~8 minutes on 2 cores.
#   bash bench/results/s30/build.sh      (from the repository root)
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s30
mkdir -p $B
build() {  # build <source dir> <build dir> <output name> <targets>
  cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=ON -DFLASH_KDA_BUILD_BENCH=ON \
    -DFLASH_KDA_BUILD_EXAMPLES=OFF > $2.cfg.log
  cmake --build $2 -j2 --target $4 > $2.build.log
  mkdir -p $B/$3
  for t in $4; do cp "$(find $2 -name $t -type f -perm -u+x | head -1)" $B/$3/; done
  strip $B/$3/*
}
rm -rf /tmp/s30_m && git worktree add -f /tmp/s30_m 33df773 > /dev/null
build /tmp/s30_m $B/src_m m "kda_bench test_cuda_decode"
git worktree remove --force /tmp/s30_m
rm -rf /tmp/s30_x && mkdir -p /tmp/s30_x
git ls-files -z | (cd $ROOT && xargs -0 cp --parents -t /tmp/s30_x)
sed -i 's/inline constexpr bool kDecodeMatrixSteps = false;/inline constexpr bool kDecodeMatrixSteps = true;/' \
  /tmp/s30_x/src/cuda/sm90/kda_decode_sm90.cuh
grep -q "kDecodeMatrixSteps = true" /tmp/s30_x/src/cuda/sm90/kda_decode_sm90.cuh
build /tmp/s30_x $B/src_x x "kda_bench test_cuda_decode test_cuda_sanitize"
rm -rf /tmp/s30_x
XZ_OPT=-9e tar -cJf $B/s30.tar.xz -C $B m x
ls -la $B/*.tar.xz
