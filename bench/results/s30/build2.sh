#!/bin/bash
# Builds for bench/results/s30/run3.sh from the checked-out tree, the matrix step on in each:
#   x2a = kDecodeMatrixChains = 1 (two accumulator chains for the products);
#   x2b = x2a + kDecodeMatrixTwoPasses = true (bf16 pools at D = 128: the whole head a CTA in two passes);
# packed into build-s30/s30c.tar.xz.
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s30
variant() {  # variant <name> <targets> <sed expressions...>
  local name=$1 targets=$2
  shift 2
  rm -rf /tmp/s30_$name && mkdir -p /tmp/s30_$name $B/$name
  git ls-files -z | (cd $ROOT && xargs -0 cp --parents -t /tmp/s30_$name)
  local H=/tmp/s30_$name/src/cuda/sm90/kda_decode_sm90.cuh
  for e in "$@"; do sed -i "$e" $H; done
  grep -E "kDecodeMatrix(Steps|Chains|TwoPasses) =" $H
  cmake -S /tmp/s30_$name -B $B/src_$name -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=ON \
    -DFLASH_KDA_BUILD_BENCH=ON -DFLASH_KDA_BUILD_EXAMPLES=OFF > $B/src_$name.cfg.log
  cmake --build $B/src_$name -j2 --target $targets > $B/src_$name.build.log
  for t in $targets; do cp "$(find $B/src_$name -name $t -type f -perm -u+x | head -1)" $B/$name/; done
  strip $B/$name/*
  rm -rf /tmp/s30_$name
}
ON='s/inline constexpr bool kDecodeMatrixSteps = false;/inline constexpr bool kDecodeMatrixSteps = true;/'
CH='s/inline constexpr int kDecodeMatrixChains = 0;/inline constexpr int kDecodeMatrixChains = 1;/'
TP='s/inline constexpr bool kDecodeMatrixTwoPasses = false;/inline constexpr bool kDecodeMatrixTwoPasses = true;/'
variant x2a "kda_bench" "$ON" "$CH"
variant x2b "kda_bench test_cuda_decode" "$ON" "$CH" "$TP"
XZ_OPT=-9e tar -cJf $B/s30c.tar.xz -C $B x2a x2b
ls -la $B/s30c.tar.xz
