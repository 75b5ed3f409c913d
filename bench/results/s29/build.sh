#!/bin/bash
# Builds what bench/results/s29/run1.sh runs, on the development machine (no GPU):
#   m  = 08e6317 (main before session 29), d1 = the checked-out tree as it is (kDecodeFoldSteps as
#   committed: false), d2 = the same with kDecodeFoldSteps = true;
# stripped, packed into build-s29/s29a.tar.xz (m, d1) and s29b.tar.xz (d2). ~10 minutes on 2 cores.
#   bash bench/results/s29/build.sh      (from the repository root)
set -euo pipefail
ROOT=$PWD
B=$ROOT/build-s29
mkdir -p $B
TARGETS="kda_bench test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool test_cuda_decode test_cuda_sanitize"
build() {  # build <source dir> <build dir> <output name>
  cmake -S $1 -B $2 -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=ON -DFLASH_KDA_BUILD_BENCH=ON \
    -DFLASH_KDA_BUILD_EXAMPLES=OFF > $2.cfg.log
  cmake --build $2 -j2 --target $TARGETS > $2.build.log
  mkdir -p $B/$3
  for t in $TARGETS; do cp "$(find $2 -name $t -type f -perm -u+x | head -1)" $B/$3/; done
  strip $B/$3/*
}
rm -rf /tmp/s29_m && git worktree add -f /tmp/s29_m 08e6317 > /dev/null
build /tmp/s29_m $B/src_m m
git worktree remove --force /tmp/s29_m
build $ROOT $B/src_d1 d1
rm -rf /tmp/s29_d2 && mkdir -p /tmp/s29_d2
git ls-files -z | (cd $ROOT && xargs -0 cp --parents -t /tmp/s29_d2)
sed -i 's/inline constexpr bool kDecodeFoldSteps = false;/inline constexpr bool kDecodeFoldSteps = true;/' \
  /tmp/s29_d2/src/cuda/sm90/kda_decode_sm90.cuh
grep -q "kDecodeFoldSteps = true" /tmp/s29_d2/src/cuda/sm90/kda_decode_sm90.cuh
build /tmp/s29_d2 $B/src_d2 d2
rm -rf /tmp/s29_d2
XZ_OPT=-9e tar -cJf $B/s29a.tar.xz -C $B m d1
XZ_OPT=-9e tar -cJf $B/s29b.tar.xz -C $B d2
ls -la $B/*.tar.xz
