#!/bin/bash
# Session 30, call 4: main with the matrix step on (n, build3.sh) against m = 33df773 (build.sh).
#   1. the decode table, m / n alternating, two rounds; 2. n's decode GPU tests, memcheck, racecheck.
#   OUT=<dir> bash bench/results/s30/run4.sh
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for f in build-s30/s30.tar.xz build-s30/s30d.tar.xz; do tar -xJf $f -C build-s30; done
mkdir -p $D/raw/dec
echo "== 1. decode $(t)"
for r in 1 2; do for b in m n; do
  build-s30/$b/kda_bench decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec m n
echo "== 2. tests $(t)"
timeout 150 build-s30/n/test_cuda_decode > $D/raw/test_cuda_decode_n.log 2>&1
echo "n test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_n.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_n.log) $(t)"
grep -E "^\[  FAILED|Failure" $D/raw/test_cuda_decode_n.log | head -5
grep -E "640 pairs bf16 T=|720 x" $D/raw/test_cuda_decode_n.log | head -6
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool build-s30/n/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_n_$tool.log 2>&1
  echo "n decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_n_$tool.log | tail -1) $(t)"
done
tar czf $D/raw.tgz -C $D raw
rm -rf $D/raw
echo "== done $(t)"
