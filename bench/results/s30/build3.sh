#!/bin/bash
# n for bench/results/s30/run4.sh: the checked-out tree as committed (the matrix step on for bf16 pools
# at D = 128 in two passes); packed into build-s30/s30d.tar.xz.
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s30
T="kda_bench test_cuda_decode test_cuda_sanitize"
cmake -S $ROOT -B $B/src_n -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=ON -DFLASH_KDA_BUILD_BENCH=ON \
  -DFLASH_KDA_BUILD_EXAMPLES=OFF > $B/src_n.cfg.log
cmake --build $B/src_n -j2 --target $T > $B/src_n.build.log
mkdir -p $B/n
for t in $T; do cp "$(find $B/src_n -name $t -type f -perm -u+x | head -1)" $B/n/; done
strip $B/n/*
XZ_OPT=-9e tar -cJf $B/s30d.tar.xz -C $B n
ls -la $B/s30d.tar.xz
