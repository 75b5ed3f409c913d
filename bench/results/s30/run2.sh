#!/bin/bash
# Session 30, call 2: the matrix decode step.
#   builds (bench/results/s30/build.sh, build1.sh): m = 33df773 (main: folded token walk), x = the matrix
#   step on (kDecodeMatrixSteps = true: steps of several tokens, 4 rows a thread), x1 = x with fixed
#   batches of one token on it too.
#   1. the decode table, m / x / x1 alternating, two rounds (ratios to m);
#   2. x's decode GPU tests, memcheck and racecheck on the sanitizer's decode cases; x1's decode tests.
#   OUT=<dir> bash bench/results/s30/run2.sh
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for f in build-s30/s30.tar.xz build-s30/s30b.tar.xz; do [ -f $f ] && tar -xJf $f -C build-s30; done
mkdir -p $D/raw/dec
BUILDS="m x"
[ -d build-s30/x1 ] && BUILDS="m x x1"
echo "== 1. decode $(t)"
for r in 1 2; do for b in $BUILDS; do
  build-s30/$b/kda_bench decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec $BUILDS
echo "== 2. tests $(t)"
for b in $BUILDS; do
  [ $b = m ] && continue
  timeout 120 build-s30/$b/test_cuda_decode > $D/raw/test_cuda_decode_$b.log 2>&1
  echo "$b test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_$b.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_$b.log) $(t)"
  grep -E "^\[  FAILED|Failure|rel|error" $D/raw/test_cuda_decode_$b.log | head -8
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool build-s30/x/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_x_$tool.log 2>&1
  echo "x decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_x_$tool.log | tail -1) $(t)"
done
tar czf $D/raw.tgz -C $D raw
rm -rf $D/raw
echo "== done $(t)"
