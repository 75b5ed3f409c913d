#!/bin/bash
# Session 28, call 5: m3 = m2 with the unit's index arithmetic done once (thread 0 takes every thread's
# token view and adds only the liveness and the read slot; m2 computed the divisions twice), against
# m2 and h (5551104).
#   1. the decode table, h, m2 and m3 alternating, two rounds;
#   2. m3's decode GPU tests, memcheck and racecheck on its decode sanitizer cases.
#   OUT=<dir> bash bench/results/s28/run5.sh
# (builds: build-s28/s28d.tar.xz with m3/, s28c with m2/, build-s27/s27a.tar.xz with h/)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27 h
tar -xJf build-s28/s28c.tar.xz -C build-s28 m2/kda_bench
tar -xJf build-s28/s28d.tar.xz -C build-s28
mkdir -p $D/raw/dec
for r in 1 2; do for b in h m2 m3; do
  B=build-s27/h/kda_bench; [ $b != h ] && B=build-s28/$b/kda_bench
  $B decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec h m2 m3
echo "== tests $(t)"
timeout 100 build-s28/m3/test_cuda_decode > $D/raw/test_cuda_decode.log 2>&1
echo "m3 test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode.log)"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool build-s28/m3/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_$tool.log 2>&1
  echo "m3 decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_$tool.log | tail -1) $(t)"
done
tar czf $D/raw.tgz -C $D raw && rm -rf $D/raw
echo "== done $(t)"
