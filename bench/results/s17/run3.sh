#!/bin/bash
# device run 3 (prepared in session 17, not run: no device could be started after run 1): N = main
# (kda_bench), D = 92cc729, main + two passes over a CTA's rows for bf16 decode pools (kda_bench,
# test_cuda_decode, test_cuda_sanitize), packed as build-dev/nd.tar.xz (README.md here says how).
# GPU decode tests of D, the decode benchmark of N and D alternating, memcheck/racecheck of D's decode;
# then from N: the checkpoint cost (issue 14 item 2) and a segment-length sweep of fixed32 / long64k_32.
set -u
exec > >(tee $OUT/log.txt) 2>&1   # (what ran so far comes back even if the call is cut short)
S=$SECONDS
O=/tmp/o; mkdir -p $O
(cd build-dev && tar -xJf nd.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
echo "== decode tests of D [$((SECONDS-S))s]"
timeout 90 build-dev/D/test_cuda_decode > $O/test_cuda_decode.log 2>&1; echo "rc=$? $(grep -c ' ok' $O/test_cuda_decode.log) ok $(grep -ciE 'fail' $O/test_cuda_decode.log) fail-lines"
grep -iE "fail" $O/test_cuda_decode.log | head -5
echo "== decode A/B [$((SECONDS-S))s]"
for r in 1 2 3; do
  for b in N D; do
    [[ $((SECONDS-S)) -gt 200 ]] && break 2
    build-dev/$b/kda_bench decode --reps 30 --json $O/dec_${b}_$r.json > $O/dec_${b}_$r.txt 2>&1
  done
done
python3 - <<'PY'
import json,statistics,glob
def load(b): return [{x['case']:x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/dec_{b}_*.json'))]
R={b:load(b) for b in 'ND'}
n=min(len(R['N']),len(R['D']))
if n:
    print(f"{'case':<20} {'N ms':>8} {'D ms':>8} {'D/N':>6} {'N ratio':>8} {'D ratio':>8}  per-round D/N")
    for c in R['N'][0]:
        tn=[R['N'][i][c]['ours_ms_median'] for i in range(n)]; td=[R['D'][i][c]['ours_ms_median'] for i in range(n)]
        fl=statistics.median([R['N'][i][c]['copy_ms_median'] for i in range(n)])
        mn,md=statistics.median(tn),statistics.median(td)
        print(f"{c:<20} {mn:8.4f} {md:8.4f} {md/mn:6.3f} {mn/fl if fl else 0:8.2f} {md/fl if fl else 0:8.2f}  "+" ".join(f"{d/a:.3f}" for a,d in zip(tn,td)))
PY
for tool in memcheck racecheck; do
  [[ $((SECONDS-S)) -gt 300 ]] && break
  timeout 60 compute-sanitizer --tool $tool build-dev/D/test_cuda_sanitize --gtest_filter='*Decode*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
B=build-dev/N/kda_bench
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
echo "== checkpoint cost [$((SECONDS-S))s]"
for r in 1 2; do
  [[ $((SECONDS-S)) -gt 400 ]] && break
  $B prefill --reps 10 --json $O/ck0_$r.json $CK > $O/ck0_$r.txt 2>&1
  $B prefill --reps 10 --ckpt 1024 --json $O/ck1024_$r.json $CK > $O/ck1024_$r.txt 2>&1
done
python3 - <<'PY'
import json,statistics,glob
def load(tag): return [{x['case']:x['ours_ms_median'] for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{tag}_*.json'))]
ra,rb=load('ck0'),load('ck1024')
n=min(len(ra),len(rb))
for k in (ra[0] if n else {}):
    a=statistics.median(x[k] for x in ra[:n]); b=statistics.median(x[k] for x in rb[:n])
    print(f"{k:<12} none {a:.4f}  ckpt1024 {b:.4f}  ratio {b/a:.3f}  rounds "+" ".join(f"{y[k]/x[k]:.3f}" for x,y in zip(ra,rb)))
PY
echo "== segment length sweep [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 480 ]] && $B prefill --reps 10 --plans auto,split32:144,split32:168,split32:200,split32:232,split32:256 fixed32 > $O/sweep_fixed32.txt 2>&1
[[ $((SECONDS-S)) -lt 500 ]] && $B prefill --reps 5 --plans auto,split32:1200,split32:1360,split32:1600,split32:1800,split32:2048 long64k_32 > $O/sweep_long.txt 2>&1
grep -hE "^(fixed32|long64k_32) " $O/sweep_*.txt
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
