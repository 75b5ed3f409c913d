#!/bin/bash
# device run 5 (session 19). Y = fbfbec3, T1 = 8405ef6 (the prepared form without the upper blocks
# of -T and M), T2 = 66a4b3d (T1 without the K = 64 softplus preparation's spill), T3 = T2 with the
# 32-token rings capped at 200 KB (5 stages for 64-row CTAs, as before T1; not committed). Shipped as
# build-dev/s19e.tar.xz. Graph-mode A/B, three rounds; T2's GPU tests, memcheck and racecheck.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19e.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp varlen6_96 fixed96_d64 fixed16_d64 fixed16_d64_sp"
for r in 1 2 3; do
  for b in Y T1 T2 T3; do
    build-dev/$b/kda_bench prefill --reps 10 --graph --json $O/gr_${b}_$r.json $CASES > /dev/null 2>&1
  done
  build-dev/T2/kda_bench prefill --reps 10 --graph --ckpt 1024 --json $O/gck_T2_$r.json fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k > /dev/null 2>&1
done
echo "== tables $(t)"
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
def med(rs, k): return statistics.median(x[k]['ours_ms_median'] for x in rs)
y, t1, t2, t3, ck = load('gr_Y'), load('gr_T1'), load('gr_T2'), load('gr_T3'), load('gck_T2')
print(f"{'case':<14} {'Y ms':>8} {'T1/Y':>6} {'T2/Y':>6} {'T3/Y':>6} {'T2 ck/none':>10}  per round T2/Y")
for k in y[0]:
    c = f"{med(ck,k)/med(t2,k):10.3f}" if k in ck[0] else " " * 10
    print(f"{k:<14} {med(y,k):8.4f} {med(t1,k)/med(y,k):6.3f} {med(t2,k)/med(y,k):6.3f} {med(t3,k)/med(y,k):6.3f} {c}  " + " ".join(f"{b[k]['ours_ms_median']/a[k]['ours_ms_median']:.3f}" for a, b in zip(y, t2)))
PY
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/T2/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
export FLASH_KDA_GPU_PLANS=auto,fused,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool build-dev/T2/test_cuda_sanitize --gtest_filter='*Forward*:*Checkpoint*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
