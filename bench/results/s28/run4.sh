#!/bin/bash
# Session 28, call 4: the decode kernel's token vectors made at once again (m2: each thread's own
# reading of the token range; thread 0's unit decides everything a barrier or a copy depends on)
# against m (2ee527a: every thread waited for thread 0's reading) and h (5551104: no shared unit).
#   1. the decode table, h, m and m2 alternating, two rounds;
#   2. m2's decode GPU tests, memcheck and racecheck on its decode sanitizer cases.
#   OUT=<dir> bash bench/results/s28/run4.sh
# (builds: build-s28/s28c.tar.xz with m2/, s28b with m/, build-s27/s27a.tar.xz with h/)
# OLD / NEW (with their archives OLD_TAR / NEW_TAR) name the two builds beside h: m and m2 here,
# m2 and m3 in run5.sh.
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27 h
OLD=${OLD:-m} NEW=${NEW:-m2}
tar -xJf build-s28/${OLD_TAR:-s28b}.tar.xz -C build-s28 $OLD/kda_bench
tar -xJf build-s28/${NEW_TAR:-s28c}.tar.xz -C build-s28
mkdir -p $D/raw/dec
for r in 1 2; do for b in h $OLD $NEW; do
  B=build-s27/h/kda_bench; [ $b != h ] && B=build-s28/$b/kda_bench
  $B decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec h $OLD $NEW
echo "== tests $(t)"
timeout 100 build-s28/$NEW/test_cuda_decode > $D/raw/test_cuda_decode.log 2>&1
echo "$NEW test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode.log)"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool build-s28/$NEW/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_$tool.log 2>&1
  echo "$NEW decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_$tool.log | tail -1) $(t)"
done
tar czf $D/raw.tgz -C $D raw && rm -rf $D/raw
echo "== done $(t)"
