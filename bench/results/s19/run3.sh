#!/bin/bash
# device run 3 (session 19). X2 = 18f26cb; Y = X2 + the pair preparation's Y = A[b][a] (-T_a) and
# epilogue (-T_b) Y on the tensor cores (one warp, 3xTF32) instead of FMA loops (the epilogue on all
# four warps before); YS = Y + chunk a's k_dec kept in registers for chunk b (no stash read-back;
# ptxas spills 12 B in that instantiation). Shipped as build-dev/s19c.tar.xz. Graph-mode A/B (three
# rounds), ncu of the preparation (fixed32), Y's GPU tests, memcheck / racecheck.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19c.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 fixed32_sp"
for r in 1 2 3; do
  for b in X2 Y YS; do
    build-dev/$b/kda_bench prefill --reps 10 --graph --json $O/gr_${b}_$r.json $CASES > /dev/null 2>&1
  done
done
echo "== tables $(t)"
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
def med(rs, k): return statistics.median(x[k]['ours_ms_median'] for x in rs)
x, y, ys = load('gr_X2'), load('gr_Y'), load('gr_YS')
print(f"{'case':<12} {'X2 ms':>8} {'Y/X2':>6} {'YS/X2':>6}  per round Y/X2 | YS/X2")
for k in x[0]:
    print(f"{k:<12} {med(x,k):8.4f} {med(y,k)/med(x,k):6.3f} {med(ys,k)/med(x,k):6.3f}  "
          + " ".join(f"{b[k]['ours_ms_median']/a[k]['ours_ms_median']:.3f}" for a, b in zip(x, y)) + " | "
          + " ".join(f"{b[k]['ours_ms_median']/a[k]['ours_ms_median']:.3f}" for a, b in zip(x, ys)))
PY
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for b in X2 Y YS; do
  timeout 60 $NCU --kernel-name regex:kda_prep --launch-skip 2 --launch-count 1 --metrics $M build-dev/$b/kda_bench prefill --reps 1 fixed32 > $O/ncu_prep_$b.txt 2>&1
  echo "prep $b: $(grep -E 'gpu__time|inst_executed|wavefronts|dram__bytes|pct' $O/ncu_prep_$b.txt | awk '{print $1"="$NF}' | sed 's/gpu__time_duration.sum/us/;s/smsp__inst_executed.sum/inst/;s/l1tex__data_pipe_lsu_wavefronts_mem_shared.sum/wavefronts/;s/dram__bytes.sum/dramMB/;s/l1tex__throughput.avg.pct_of_peak_sustained_elapsed/l1pct/;s/dram__throughput.avg.pct_of_peak_sustained_elapsed/drampct/' | tr '\n' ' ')"
done
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/Y/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
grep -E "collinear|reflection|neg" $O/test_cuda_forward.log | grep -i "32" | head -8
export FLASH_KDA_GPU_PLANS=auto,split32,prepared32
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool build-dev/Y/test_cuda_sanitize --gtest_filter='*Forward*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
