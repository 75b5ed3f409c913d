#!/bin/bash
# Session 31, call 2: streaming CTAs for the two-pass decode kernels (bench/results/s31/build.sh:
# s = streaming on, r = the refactored kernel with streaming off) against n = 314d257 (main at the
# session's start, bench/results/s30/build3.sh).
#   1. the decode table, n / s / r alternating, two rounds;
#   2. s's decode GPU tests (the 2640-pair cases: five units a CTA), memcheck, racecheck;
#   3. on an H200 only: n's prefill table from CUDA graphs and the Python suite with FlashKDA.
#   OUT=<dir> bash bench/results/s31/run2.sh <commit>
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
mkdir -p build-s31 && tar -xJf build-s30/s30d.tar.xz -C build-s31 && tar -xJf build-s31/s31.tar.xz -C build-s31
mkdir -p $D/raw/dec
pack() { tar czf $D/raw.tgz -C $D raw; }
echo "== 1. decode $(t)"
for r in 1 2; do for b in n s r; do
  build-s31/$b/kda_bench decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec n s r
pack
echo "== 2. tests $(t)"
timeout 150 build-s31/s/test_cuda_decode > $D/raw/test_cuda_decode_s.log 2>&1
echo "s test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_s.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_s.log) $(t)"
grep -E "^\[  FAILED|Failure" $D/raw/test_cuda_decode_s.log | head -5
grep -E "2640 pairs|2700 x" $D/raw/test_cuda_decode_s.log | head -6
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool build-s31/s/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_s_$tool.log 2>&1
  echo "s decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_s_$tool.log | tail -1) $(t)"
done
pack
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "== 3. H200: prefill (n) $(t)"
  build-s31/n/kda_bench prefill --reps 10 --graph --json $D/raw/prefill_n.json > $D/raw/prefill_n.txt 2>&1
  grep -E "ms|case" $D/raw/prefill_n.txt | head -40
  pack
  mkdir -p $D/py
  OUT=$D/py RUN_FLA=${RUN_FLA:-none} RUN6_LIMIT=$((590 - (SECONDS - S))) bash bench/results/s19/run6.sh ${1:-unknown} > /dev/null 2>&1
  cat $D/py/log_bench.txt
fi
rm -rf $D/raw
echo "== done $(t)"
