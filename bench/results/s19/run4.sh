#!/bin/bash
# device run 4 (session 19). Y = fbfbec3; T = Y + the prepared form without the upper 8 x 8 block of
# -T and M (14,336 bytes a chunk instead of 14,848; the 16-token walk's output no longer multiplies
# that zero block; the 16 x 16 squares laid out by 8 x 8 blocks). Shipped as build-dev/s19d.tar.xz.
# Graph-mode A/B, three rounds (with and without --ckpt 1024 on the checkpoint rows); ncu of the
# preparation and of one pass of fixed32 (DRAM bytes); T's GPU tests under every plan, memcheck and
# racecheck.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19d.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp varlen6_96 fixed96_d64 fixed16_d64 fixed16_d64_sp"
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
for r in 1 2 3; do
  for b in Y T; do
    build-dev/$b/kda_bench prefill --reps 10 --graph --json $O/gr_${b}_$r.json $CASES > /dev/null 2>&1
    build-dev/$b/kda_bench prefill --reps 10 --graph --ckpt 1024 --json $O/gck_${b}_$r.json $CK > /dev/null 2>&1
  done
done
echo "== tables $(t)"
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
def med(rs, k): return statistics.median(x[k]['ours_ms_median'] for x in rs)
y, t, cy, ct = load('gr_Y'), load('gr_T'), load('gck_Y'), load('gck_T')
print(f"{'case':<14} {'Y ms':>8} {'T/Y':>6} {'ck T/Y':>7} {'T ck/none':>9}  per round T/Y")
for k in y[0]:
    c = f"{med(ct,k)/med(cy,k):7.3f} {med(ct,k)/med(t,k):9.3f}" if k in cy[0] else " " * 17
    print(f"{k:<14} {med(y,k):8.4f} {med(t,k)/med(y,k):6.3f} {c}  " + " ".join(f"{b[k]['ours_ms_median']/a[k]['ours_ms_median']:.3f}" for a, b in zip(y, t)))
PY
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for b in Y T; do
  timeout 90 $NCU --kernel-name regex:kda_ --launch-skip 10 --launch-count 5 --metrics $M build-dev/$b/kda_bench prefill --reps 1 fixed32 > $O/ncu_$b.txt 2>&1
  echo "$b:"; grep -E "^  [a-z].*kda_|gpu__time|dram__bytes" $O/ncu_$b.txt | sed 's/(Kda.*//;s/  */ /g' | paste - - - | awk '{print $1, $2, $(NF-4), $(NF-3), $NF}'
done
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/T/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
export FLASH_KDA_GPU_PLANS=auto,fused,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool build-dev/T/test_cuda_sanitize --gtest_filter='*Forward*:*Checkpoint*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
