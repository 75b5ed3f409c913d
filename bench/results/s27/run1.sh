#!/bin/bash
# Session 27, call 1: main's kernels on the card before any change, and the streaming decode:
#   1. the filled rows under the automatic, fused and prepared plans (issue 11: which plan the
#      automatic one should pick), two rounds;
#   2. fixed32 and long64k_32 with more segments than the planner's three (split32:L), issue 10;
#   3. the decode table with its copy floors (issue 14): h (main's kernels) against the streaming
#      decode (s1: bf16 pools stream, two buffers; f2: fp32 pools too, 2 rows a thread; x3: both
#      with three buffers, fp32 at 2 rows a thread), two
#      alternating rounds; s1's decode GPU tests and its decode sanitizer cases;
#   4. the checkpoint cost: --ckpt 1024 against none, alternating, two rounds (issue 14).
#   OUT=<dir> [LIMIT=<s>] [SHORT=1] bash bench/results/s27/run1.sh
# SHORT=1: the shortest call that still decides the decode rule (~3 minutes): the decode table's
# large-batch rows only, memcheck only, then b16x2048_32's plans, nothing else.
# (builds: build-s27/s27a.tar.xz, stripped binaries in h/, s1/, f2/, x3/; README.md says how they are made)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s27/s27a.tar.xz -C build-s27
H=build-s27/h
B=$H/kda_bench
echo "== 3. decode $(t)"
mkdir -p $D/dec
DB="h s1 f2 x3"
CASES=""
[ -n "${SHORT:-}" ] && CASES="decode256_32 b256_t4_fp32 b256_t1_bf16 b256_t4_bf16 b64_t1_fp32 b64_t4_fp32 b64_t1_bf16 b64_t4_bf16"
for r in 1 2; do for b in $DB; do
  build-s27/$b/kda_bench decode --reps 30 --json $D/dec/${b}_$r.json $CASES > $D/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/dec $DB
timeout 100 build-s27/s1/test_cuda_decode > $D/dec/test_cuda_decode.log 2>&1
echo "s1 test_cuda_decode rc=$? $(grep -cE '^\[       OK \]' $D/dec/test_cuda_decode.log) ok $(grep -cE '^\[  FAILED  \]' $D/dec/test_cuda_decode.log) failed-lines $(t)"
TOOLS="memcheck racecheck"
[ -n "${SHORT:-}" ] && TOOLS=memcheck
for tool in $TOOLS; do
  timeout 90 compute-sanitizer --tool $tool build-s27/s1/test_cuda_sanitize --gtest_filter='*Decode*' > $D/dec/san_$tool.log 2>&1
  echo "s1 decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/dec/san_$tool.log | tail -1) $(t)"
done
if [ -n "${SHORT:-}" ]; then
  $B prefill --reps 10 --graph --plans auto,fused,prepared --json $D/plans.json b16x2048_32 | tail -4
  echo "== done $(t)"; exit 0
fi
echo "== 1. plans $(t)"
for r in 1 2; do
  $B prefill --reps 10 --graph --plans auto,fused,prepared --json $D/plans_$r.json \
    fixed96 varlen6_96 v1024x8_96 fixed64 varlen6_64 v1024x8_64 b16x2048_32 > $D/plans_$r.txt 2>&1
done
python3 - $D <<'PY'
import json, statistics, sys
d = sys.argv[1]
R = [{(x['case'], x['plan']): x for x in json.load(open(f'{d}/plans_{r}.json'))} for r in (1, 2)]
cases = list(dict.fromkeys(c for c, _ in R[0]))
print(f"{'case':<14} {'auto':>8} {'fused':>8} {'prepared':>9} {'prep/fused':>10} {'floor':>7}")
for c in cases:
    m = {p: statistics.median(r[(c, p)]['ours_ms_median'] for r in R) for p in ('auto', 'fused', 'prepared')}
    fl = statistics.median(r[(c, 'auto')]['copy_ms_median'] for r in R)
    print(f"{c:<14} {m['auto']:8.4f} {m['fused']:8.4f} {m['prepared']:9.4f} {m['prepared']/m['fused']:10.3f} {fl:7.4f}")
PY
echo "== 2. segment counts $(t)"
$B prefill --reps 10 --graph --plans auto,split32:128,split32:104 fixed32 | tail -4
$B prefill --reps 10 --graph --plans auto,split32:1024,split32:820 long64k_32 | tail -4
[ $((SECONDS - S)) -gt ${LIMIT:-400} ] && { echo "== skipped 4 (time) $(t)"; exit 0; }
echo "== 4. checkpoint cost $(t)"
printf '#!/bin/bash\nexec %s "$@" --ckpt 1024\n' "$PWD/$B" > /tmp/kda_bench_ckpt && chmod +x /tmp/kda_bench_ckpt
OUT=$D/ckpt bash scripts/ab_bench.sh $B /tmp/kda_bench_ckpt 2 -- prefill --reps 10 --graph \
  fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k long64k_32 | grep -v "^== round"
echo "== done $(t)"
