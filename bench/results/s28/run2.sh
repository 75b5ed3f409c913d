#!/bin/bash
# Session 28, call 2: the fused kernel on compact stages (c1: main at the session with
# kFusedCompactStages = true; c2: the same with 4 ring stages) against h (5551104: fp32 stages), and
# its GPU checks.
#   1. the packed rows under --plans fused,prepared: h, c1 and c2 alternating, two rounds;
#   2. c1's forward GPU tests under the fused plan (FLASH_KDA_GPU_PLANS=fused,auto);
#   3. c1's forward sanitizer cases (memcheck, racecheck) and its decode cases under racecheck.
#   OUT=<dir> bash bench/results/s28/run2.sh
# (builds: build-s28/s28a.tar.xz with c1/, build-s27/s27a.tar.xz with h/; bench/results/s28/README.md)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27 h
tar -xJf build-s28/s28a.tar.xz -C build-s28
mkdir -p $D/raw
ROWS="varlen6_96 v1024x8_96 varlen6_64 v1024x8_64 b16x2048_32 mix20k fixed96"
for r in 1 2; do for b in h c1 c2; do
  B=build-s27/h/kda_bench; [ $b != h ] && B=build-s28/$b/kda_bench
  $B prefill --reps 10 --graph --plans fused,prepared --json $D/raw/${b}_$r.json $ROWS > $D/raw/${b}_$r.txt 2>&1
done; done
python3 - $D/raw <<'PY'
import json, statistics, sys
d = sys.argv[1]
R = {b: [{(x['case'], x['plan']): x for x in json.load(open(f'{d}/{b}_{r}.json'))} for r in (1, 2)] for b in ('h', 'c1', 'c2')}
med = lambda b, k, f='ours_ms_median': statistics.median(r[k][f] for r in R[b])
print(f"{'case':<13} {'h fused':>8} {'c1 fused':>9} {'c1/h':>6} {'c2/h':>6} {'prepared':>9} {'c1f/prep':>8} {'floor':>7} {'c1 flr':>7}")
for (c, p) in R['h'][0]:
    if p != 'fused': continue
    hf, cf, c2, pr = med('h', (c, 'fused')), med('c1', (c, 'fused')), med('c2', (c, 'fused')), med('c1', (c, 'prepared'))
    fl = med('h', (c, 'fused'), 'copy_ms_median')
    print(f"{c:<13} {hf:8.4f} {cf:9.4f} {cf/hf:6.3f} {c2/hf:6.3f} {pr:9.4f} {cf/pr:8.3f} {fl:7.4f} {cf/fl:7.2f}")
PY
echo "== tests $(t)"
FLASH_KDA_GPU_PLANS=fused,auto timeout 200 build-s28/c1/test_cuda_forward > $D/raw/test_fwd.log 2>&1
echo "c1 test_cuda_forward rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_fwd.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_fwd.log)"
grep -E "FAIL|rel|error" $D/raw/test_fwd.log | head -20
for tool in memcheck racecheck; do
  FLASH_KDA_GPU_PLANS=fused,auto timeout 120 compute-sanitizer --tool $tool build-s28/c1/test_cuda_sanitize --gtest_filter='*Forward*' > $D/raw/san_fwd_$tool.log 2>&1
  echo "c1 forward $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_fwd_$tool.log | tail -1) $(t)"
done
timeout 90 compute-sanitizer --tool racecheck build-s28/c1/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_dec_racecheck.log 2>&1
echo "c1 decode racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $D/raw/san_dec_racecheck.log | tail -1) $(t)"
grep -B2 -A12 -m3 "Warning\|Error" $D/raw/san_dec_racecheck.log | head -60
tar czf $D/raw.tgz -C $D raw && rm -rf $D/raw
echo "== done $(t)"
