#!/bin/bash
# Session 27, call 2 (a short GPU call): run1.sh's decode A/B on the
# decode table's large-batch rows only (h, s1, x3, f2; two alternating rounds), s1's decode GPU tests
# and memcheck of its decode sanitizer cases, then b16x2048_32 under the automatic, fused and
# prepared plans (h).    OUT=<dir> bash bench/results/s27/run2.sh   (with build-s27/s27a.tar.xz)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27
CASES="decode256_32 b256_t4_fp32 b256_t1_bf16 b256_t4_bf16 b64_t1_fp32 b64_t4_fp32 b64_t1_bf16 b64_t4_bf16"
mkdir -p $D/dec
DB="h s1 x3 f2"
for r in 1 2; do for b in $DB; do
  build-s27/$b/kda_bench decode --reps 30 --json $D/dec/${b}_$r.json $CASES > $D/dec/${b}_$r.txt 2>&1
done; echo "round $r $(t)"; done
python3 - $D/dec $DB <<'PY'
import json, statistics, sys
d, builds = sys.argv[1], sys.argv[2:]
L = {b: [{x['case']: x for x in json.load(open(f'{d}/{b}_{r}.json'))} for r in (1, 2)] for b in builds}
h = L[builds[0]]
print(f"{'case':<22} {'h ms':>8} {'h flr':>6}" + "".join(f" {b+'/h':>7} {'flr':>5}" for b in builds[1:]))
for c in h[0]:
    fl = statistics.median([x[c]['copy_ms_median'] for b in builds for x in L[b] if c in x])
    th = statistics.median(x[c]['ours_ms_median'] for x in h)
    line = f"{c:<22} {th:8.4f} {th/fl:6.3f}"
    for b in builds[1:]:
        tb = statistics.median(x[c]['ours_ms_median'] for x in L[b] if c in x)
        line += f" {tb/th:7.3f} {tb/fl:5.3f}"
    print(line)
PY
timeout 60 build-s27/s1/test_cuda_decode > $D/dec/test_cuda_decode.log 2>&1
echo "s1 test_cuda_decode rc=$? $(grep -cE '^\[       OK \]' $D/dec/test_cuda_decode.log) ok $(grep -cE '^\[  FAILED  \]' $D/dec/test_cuda_decode.log) failed-lines $(t)"
timeout 60 compute-sanitizer --tool memcheck build-s27/s1/test_cuda_sanitize --gtest_filter='*Decode*' > $D/dec/san_memcheck.log 2>&1
echo "s1 decode memcheck rc=$? $(grep -E 'ERROR SUMMARY' $D/dec/san_memcheck.log | tail -1) $(t)"
build-s27/h/kda_bench prefill --reps 10 --graph --plans auto,fused,prepared --json $D/plans.json b16x2048_32 | tail -4
echo "== done $(t)"
