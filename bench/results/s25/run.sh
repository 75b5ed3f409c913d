#!/bin/bash
# One call that measures session 24's builds in order of what depends on it (bench/results/s24/README.md
# describes the builds; needs build-dev/{s24,s24t,dec}.tar.xz in the checkout):
#   1. A/B of h, m3, f from CUDA graphs, two alternating rounds (ROUNDS);
#   1c. the fused kernel on compact fp16 stages (build-dev/f16.tar.xz, branch fused-f16) against h on
#      the rows the fused kernel runs, two rounds, and its GPU forward tests under the fused plan;
#   1b. issue 11's rows under the automatic, fused and prepared plans (h);
#   2. f's GPU tests under every plan (no sanitizers yet);
#   3. the decode A/B of h and m (two rounds) and m's decode tests;
#   4. with the time left (LIMIT seconds in all): the sanitizers of f and of the decode build,
#      f's checkpoint cost.
set -u
D=$OUT
LIMIT=${LIMIT:-540}
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
left() { [ $((LIMIT - (SECONDS - S))) -gt "$1" ]; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
F16=${F16:-f16}  # f16m: branch fused-f16-main (the same change on main)
for a in s24 s24t dec $F16; do (cd build-dev && tar -xJf $a.tar.xz); done
B=build-dev/s24
echo "== 1. A/B $(t)"
OUT=$D/ab bash scripts/ab_bench.sh $(for b in ${BUILDS:-h m3 f}; do echo $B/$b/kda_bench; done) ${ROUNDS:-2} -- \
  prefill --reps 10 --graph ${CASES:-fixed32 long64k_32 fixed16 h8_8k h4_64k fixed96} | grep -v "^== round"
echo "== 1c. fused-f16 against h $(t)"
OUT=$D/ab16 bash scripts/ab_bench.sh $B/h/kda_bench build-dev/$F16/kda_bench 2 -- prefill --reps 10 --graph \
  v1024x8_96 varlen6_96 b16x2048_32 v1024x8_64 varlen6_64 fixed96 | grep -v "^== round"
FLASH_KDA_GPU_PLANS=fused,auto timeout 100 build-dev/$F16/test_cuda_forward > $D/f16_test_cuda_forward.log 2>&1
echo "f16 test_cuda_forward rc=$? $(grep -c ' ok$' $D/f16_test_cuda_forward.log) ok $(grep -ciE 'fail' $D/f16_test_cuda_forward.log) fail-lines $(t)"
{
  echo "== 1b. issue 11's rows under each plan $(t)"
  $B/h/kda_bench prefill --reps 10 --graph --plans auto,fused,prepared --json $D/plans.json \
    fixed96 varlen6_96 v1024x8_96 fixed64 varlen6_64 v1024x8_64 b16x2048_32 2>&1 | tail -25
}
echo "== 2. f's GPU tests $(t)"
SANITIZERS= bash scripts/gpu_tests_prebuilt.sh $B/f $D/tests 2>&1 | grep -v "^  cuda"
echo "== 3. decode $(t)"
DB=build-dev/dec
mkdir -p $D/dec
for r in 1 2; do for b in h m; do
  $DB/$b/kda_bench decode --reps 30 --json $D/dec/dec_${b}_$r.json > $D/dec/dec_${b}_$r.txt 2>&1
done; done
python3 - $D/dec <<'PY'
import json, statistics, sys
d = sys.argv[1]
L = lambda b: [{x['case']: x for x in json.load(open(f'{d}/dec_{b}_{r}.json'))} for r in (1, 2)]
h, m = L('h'), L('m')
print(f"{'case':<22} {'h ms':>8} {'h flr':>6} {'m ms':>8} {'m/h':>6} {'m flr':>6}")
for c in h[0]:
    th = statistics.median(x[c]['ours_ms_median'] for x in h)
    tm = statistics.median(x[c]['ours_ms_median'] for x in m if c in x)
    fl = statistics.median([x[c]['copy_ms_median'] for x in h + m if c in x])
    print(f"{c:<22} {th:8.4f} {th/fl:6.2f} {tm:8.4f} {tm/th:6.3f} {tm/fl:6.2f}")
PY
timeout 100 $DB/m/test_cuda_decode > $D/dec/test_cuda_decode.log 2>&1
echo "test_cuda_decode rc=$? $(grep -cE '^\[       OK \]' $D/dec/test_cuda_decode.log) ok $(grep -cE '^\[  FAILED  \]' $D/dec/test_cuda_decode.log) failed-lines $(t)"
echo "== 4. $(t)"
for tool in memcheck racecheck; do
  left 150 || break
  FLASH_KDA_GPU_PLANS=auto,split32 timeout 120 compute-sanitizer --tool $tool $B/f/test_cuda_sanitize --gtest_filter='*Forward*:*Checkpoint*' > $D/san_f_$tool.log 2>&1
  echo "f $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/san_f_$tool.log | tail -1) $(t)"
  left 100 || break
  timeout 90 compute-sanitizer --tool $tool $DB/m/test_cuda_sanitize --gtest_filter='*Decode*' > $D/san_dec_$tool.log 2>&1
  echo "dec $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/san_dec_$tool.log | tail -1) $(t)"
done
if left 90; then
  printf '#!/bin/bash\nexec %s "$@" --ckpt 1024\n' "$PWD/$B/f/kda_bench" > /tmp/kda_bench_ckpt && chmod +x /tmp/kda_bench_ckpt
  echo "== checkpoint cost: f with --ckpt 1024 (build 1) against without (build 0) $(t)"
  OUT=$D/ckpt bash scripts/ab_bench.sh $B/f/kda_bench /tmp/kda_bench_ckpt 2 -- prefill --reps 10 --graph \
    fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k | grep -v "^== round"
fi
echo "== done $(t)"
