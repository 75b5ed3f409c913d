#!/bin/bash
# device run 1 (session 18): three candidates against main in one call, binaries built on the
# development machine and shipped to the GPU machine as build-dev/npd.tar.xz (N = main's kda_bench; P = 4406b3a, the
# preparation at five CTAs an SM; F = main + the chain folded into pass 3 at three segments;
# D = 92cc729, the two-pass bf16 decode; README.md here says how).
#  1. N, P and F alternating on the prefill cases; N and D alternating on the decode cases;
#  2. GPU tests of P and F under every plan, D's decode tests;
#  3. memcheck / racecheck of P's and F's forward and D's decode;
#  4. the checkpoint cost from N (`--ckpt 1024` against none), two rounds.
set -u
exec > >(tee $OUT/log.txt) 2>&1   # (what ran comes back even if the call is cut short)
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf npd.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp"
echo "== prefill A/B, N, P and F alternating $(t)"
for r in 1 2 3; do
  for b in N P F; do
    [[ $((SECONDS-S)) -gt 230 ]] && break 2
    build-dev/$b/kda_bench prefill --reps 10 --json $O/ab_${b}_$r.json $CASES > $O/ab_${b}_$r.txt 2>&1; echo "$b $r $(t)"
  done
done
echo "== decode A/B, N and D alternating $(t)"
for r in 1 2 3; do
  for b in N D; do
    [[ $((SECONDS-S)) -gt 290 ]] && break 2
    build-dev/$b/kda_bench decode --reps 30 --json $O/dec_${b}_$r.json > $O/dec_${b}_$r.txt 2>&1
  done
done
python3 - <<'PY'
import json, statistics, glob, os
O = "/tmp/o"
def load(tag):
    runs = []
    for f in sorted(glob.glob(f'{O}/{tag}_*.json')):
        try: runs.append({x['case']: x for x in json.load(open(f))})
        except Exception as e: print('bad', f, e)
    return runs
for kind, a, b in (('ab', 'N', 'P'), ('ab', 'N', 'F'), ('dec', 'N', 'D')):
    ra, rb = load(f'{kind}_{a}'), load(f'{kind}_{b}')
    n = min(len(ra), len(rb))
    if not n: continue
    print(f"{'case':<22} {a+' ms':>8} {b+' ms':>8} {b+'/'+a:>6} {a+' flr':>6} {b+' flr':>6}  per round")
    for c in ra[0]:
        if not all(c in x for x in ra[:n] + rb[:n]): continue
        ta = [x[c]['ours_ms_median'] for x in ra[:n]]; tb = [x[c]['ours_ms_median'] for x in rb[:n]]
        fl = ra[0][c].get('floor_ms') or ra[0][c].get('copy_ms_median') or 0
        ma, mb = statistics.median(ta), statistics.median(tb)
        print(f"{c:<22} {ma:8.4f} {mb:8.4f} {mb/ma:6.3f} {ma/fl if fl else 0:6.2f} {mb/fl if fl else 0:6.2f}  "
              + " ".join(f"{y/x:.3f}" for x, y in zip(ta, tb)))
PY
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for b in P F; do
  echo "== GPU tests of $b $(t)"
  for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do [[ -x build-dev/$b/$x ]] || continue
    [[ $((SECONDS-S)) -gt 440 ]] && break 2
    timeout 60 build-dev/$b/$x > $O/${b}_$x.log 2>&1
    echo "$b $x rc=$? $(grep -cE '^\[       OK' $O/${b}_$x.log) ok $(grep -cE 'FAIL' $O/${b}_$x.log) FAIL-lines"
  done
  grep -hE 'FAIL|Failure' $O/${b}_test_cuda_*.log | head -10
done
unset FLASH_KDA_GPU_PLANS
echo "== decode tests of D $(t)"
timeout 40 build-dev/D/test_cuda_decode > $O/test_cuda_decode.log 2>&1
echo "test_cuda_decode rc=$? $(grep -cE '^\[       OK' $O/test_cuda_decode.log) ok $(grep -cE 'FAIL' $O/test_cuda_decode.log) FAIL-lines"
echo "== sanitizers $(t)"
for tool in memcheck racecheck; do
  [[ $((SECONDS-S)) -gt 500 ]] && break
  for b in P F; do
    FLASH_KDA_GPU_PLANS=auto,split:3,split32,prepared32 timeout 25 compute-sanitizer --tool $tool build-dev/$b/test_cuda_sanitize --gtest_filter='*Forward*' > $O/san_${b}_$tool.log 2>&1
    echo "$b $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_${b}_$tool.log | tail -1)"
  done
  timeout 15 compute-sanitizer --tool $tool build-dev/D/test_cuda_sanitize --gtest_filter='*Decode*' > $O/san_D_$tool.log 2>&1
  echo "D $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_D_$tool.log | tail -1)"
done
echo "== checkpoint cost (N) $(t)"
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
for r in 1 2; do
  [[ $((SECONDS-S)) -gt 545 ]] && break
  build-dev/N/kda_bench prefill --reps 10 --json $O/ck0_$r.json $CK > $O/ck0_$r.txt 2>&1
  build-dev/N/kda_bench prefill --reps 10 --ckpt 1024 --json $O/ck1024_$r.json $CK > $O/ck1024_$r.txt 2>&1
done
python3 - <<'PY'
import json, statistics, glob, os
O = "/tmp/o"
def load(tag): return [{x['case']: x['ours_ms_median'] for x in json.load(open(f))} for f in sorted(glob.glob(f'{O}/{tag}_*.json'))]
ra, rb = load('ck0'), load('ck1024')
n = min(len(ra), len(rb))
for k in (ra[0] if n else {}):
    a = statistics.median(x[k] for x in ra[:n]); b = statistics.median(x[k] for x in rb[:n])
    print(f"{k:<12} none {a:.4f}  ckpt1024 {b:.4f}  ratio {b/a:.3f}  rounds " + " ".join(f"{y[k]/x[k]:.3f}" for x, y in zip(ra, rb)))
PY
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
