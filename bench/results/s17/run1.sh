#!/bin/bash
# device run 1 (session 17): GPU tests of L (main + the late preparation), A/B N (main) vs L,
# sanitizers of L, ncu per kernel of fixed32 for N and L. Any other candidate the same way:
#   bash run1.sh [TARBALL [NAME]]  (default build-dev/bins.tar.xz, L: the tarball holds N/kda_bench and
#   NAME/{kda_bench,test_cuda_forward,test_cuda_checkpoints,test_cuda_prefill_pool,test_cuda_sanitize})
set -u
S=$SECONDS
O=/tmp/o; mkdir -p $O
TAR=${1:-build-dev/bins.tar.xz}; L=${2:-L}
tar -xJf $TAR -C build-dev
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp"
echo "== GPU tests of $L [$((SECONDS-S))s]"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for t in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 150 build-dev/$L/$t > $O/$t.log 2>&1; echo "$t rc=$? $(grep -cE '^\[       OK' $O/$t.log) ok $(grep -cE 'FAIL' $O/$t.log) FAIL-lines"
done
grep -E 'FAIL|Failure|error' $O/test_cuda_*.log | head -20
echo "== A/B [$((SECONDS-S))s]"
for r in 1 2 3 4; do
  for b in N $L; do
    [[ $((SECONDS-S)) -gt 400 ]] && break 2
    build-dev/$b/kda_bench prefill --reps 10 --json $O/ab_${b}_$r.json $CASES > $O/ab_${b}_$r.txt 2>&1
  done
done
echo "== sanitizers [$((SECONDS-S))s]"
export FLASH_KDA_GPU_PLANS=auto,split:3,split32,prepared32
for tool in memcheck racecheck; do
  [[ $((SECONDS-S)) -gt 470 ]] && break
  timeout 60 compute-sanitizer --tool $tool build-dev/$L/test_cuda_sanitize --gtest_filter='*Forward*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== per-kernel durations (ncu, fixed32) [$((SECONDS-S))s]"
for b in N $L; do
  [[ $((SECONDS-S)) -gt 530 ]] && break
  timeout 30 ncu --launch-skip 0 --launch-count 12 --section SpeedOfLight build-dev/$b/kda_bench prefill --reps 1 fixed32 > $O/ncu_$b.txt 2>&1
  grep -E 'Context 1|Duration' $O/ncu_$b.txt | sed -E 's/^ *//; s/\(.*Context.*//; s/ +/ /g' | cut -c1-60 | paste -sd' ' | sed 's/Duration/\n/g' | head -14
done
L=$L python3 - <<'PY'
import json,statistics,glob,os
V=os.environ['L']
def load(b):
    runs=[]
    for f in sorted(glob.glob(f'/tmp/o/ab_{b}_*.json')):
        try: runs.append({x['case']:x['ours_ms_median'] for x in json.load(open(f))})
        except Exception as e: print('bad',f,e)
    return runs
R={'N':load('N'),'L':load(V)}
print(f"{'case':<12} {'N ms':>8} {'L ms':>8} {'L/N':>6} L/N per-round")
for k in (R['N'][0] if R['N'] else {}):
    if not all(k in x for b in 'NL' for x in R[b]): continue
    med={b:statistics.median(x[k] for x in R[b]) for b in 'NL'}
    print(f"{k:<12} {med['N']:8.4f} {med['L']:8.4f} {med['L']/med['N']:6.3f} "+" ".join(f"{c[k]/a[k]:.3f}" for a,c in zip(R['N'],R['L'])))
PY
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
