#!/bin/bash
# device run 7 (session 18): the loader's step with 32-bit tokens and a running v offset (V = main +
# that change) against main (M = 1237d63), shipped to the GPU machine as build-dev/v.tar.xz: prefill A/B alternating (three
# rounds), the checkpoint cost of V, V's GPU tests under every plan, memcheck / racecheck of V's forward.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf v.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp"
for r in 1 2 3; do
  for b in M V; do
    build-dev/$b/kda_bench prefill --reps 10 --json $O/ab_${b}_$r.json $CASES > /dev/null 2>&1
  done
  build-dev/V/kda_bench prefill --reps 10 --ckpt 1024 --json $O/ck_V_$r.json fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k > /dev/null 2>&1
done
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x['ours_ms_median'] for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
a, b, c = load('ab_M'), load('ab_V'), load('ck_V')
print(f"{'case':<12} {'M ms':>8} {'V ms':>8} {'V/M':>6} {'V ck1024/V':>11}  per round V/M")
for k in a[0]:
    ma = statistics.median(x[k] for x in a); mb = statistics.median(x[k] for x in b)
    ck = f"{statistics.median(x[k] for x in c)/mb:11.3f}" if k in c[0] else " " * 11
    print(f"{k:<12} {ma:8.4f} {mb:8.4f} {mb/ma:6.3f} {ck}  " + " ".join(f"{y[k]/x[k]:.3f}" for x, y in zip(a, b)))
PY
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 90 build-dev/V/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
export FLASH_KDA_GPU_PLANS=auto,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool build-dev/V/test_cuda_sanitize --gtest_filter='*Forward*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
