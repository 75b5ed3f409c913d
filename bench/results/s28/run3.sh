#!/bin/bash
# Session 28, call 3: main's GPU checks and tables (m: main at 2ee527a -- compact fused stages on,
# the one-stage decode kernel only; h: 5551104).
#   1. the GPU tests under every plan (forward, checkpoints, prefill on pools, decode);
#   2. compute-sanitizer memcheck and racecheck on the forward and decode cases;
#   3. the decode table, h and m alternating, two rounds (the decode refactor must not move it), and
#      the prefill rows of both BENCH tables under m (auto plan, CUDA graphs).
#   OUT=<dir> [LIMIT=<s>] bash bench/results/s28/run3.sh   (past LIMIT seconds: no racecheck, no prefill table)
# (builds: build-s28/s28b.tar.xz with m/, build-s27/s27a.tar.xz with h/; bench/results/s28/README.md)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27 h
tar -xJf build-s28/s28b.tar.xz -C build-s28
M=build-s28/m
mkdir -p $D/raw
echo "== 1. GPU tests $(t)"
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool test_cuda_decode; do
  timeout 240 $M/$x > $D/raw/$x.log 2>&1
  echo "$x rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/$x.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/$x.log) $(t)"
  grep -E "^\[  FAILED|Failure" $D/raw/$x.log | head -5
done
echo "== 2. sanitizers $(t)"
for tool in memcheck racecheck; do for f in Forward Decode; do
  [ $tool = racecheck ] && [ $((SECONDS - S)) -gt ${LIMIT:-300} ] && { echo "skipped $f $tool (time)"; continue; }
  timeout 150 compute-sanitizer --tool $tool $M/test_cuda_sanitize --gtest_filter="*$f*" > $D/raw/san_${f}_$tool.log 2>&1
  echo "$f $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_${f}_$tool.log | tail -1) $(t)"
done; done
echo "== 3. tables $(t)"
mkdir -p $D/raw/dec
for r in 1 2; do for b in h m; do
  B=build-s27/h/kda_bench; [ $b = m ] && B=$M/kda_bench
  $B decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec h m
[ $((SECONDS - S)) -gt ${LIMIT:-300} ] && { echo "skipped the prefill table (time)"; tar czf $D/raw.tgz -C $D raw; exit 0; }
$M/kda_bench prefill --reps 10 --graph --json $D/raw/prefill_m.json > $D/raw/prefill_m.txt 2>&1
grep -E "ms|case" $D/raw/prefill_m.txt | head -40
tar czf $D/raw.tgz -C $D raw && rm -rf $D/raw
echo "== done $(t)"
