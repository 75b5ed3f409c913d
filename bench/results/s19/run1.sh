#!/bin/bash
# device run 1 (session 19). M = main at the session's start (4779c84) and X = M + the preparation
# started beside the plan kernel (fixed batches), both with the benchmark's --graph mode, shipped
# as build-dev/s19a.tar.xz. Prefill A/B alternating, eager and from CUDA graphs (three rounds each);
# the checkpoint cost (--ckpt 1024 against none) eager and from graphs; X's GPU tests under every
# plan, memcheck / racecheck of X's forward; ncu of the preparation of fixed32 with 16- and 32-token
# steps (the pair format's cost).
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19a.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp"
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
for r in 1 2 3; do
  for b in M X; do
    build-dev/$b/kda_bench prefill --reps 10 --json $O/ab_${b}_$r.json $CASES > /dev/null 2>&1
    build-dev/$b/kda_bench prefill --reps 10 --graph --json $O/gr_${b}_$r.json $CASES > /dev/null 2>&1
  done
  build-dev/X/kda_bench prefill --reps 10 --graph --ckpt 1024 --json $O/gck_X_$r.json $CK > /dev/null 2>&1
  build-dev/X/kda_bench prefill --reps 10 --ckpt 1024 --json $O/ck_X_$r.json $CK > /dev/null 2>&1
done
echo "== tables $(t)"
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
def med(rs, k, f='ours_ms_median'): return statistics.median(x[k][f] for x in rs)
am, ax, gm, gx, ck, gck = load('ab_M'), load('ab_X'), load('gr_M'), load('gr_X'), load('ck_X'), load('gck_X')
print(f"{'case':<12} {'M eager':>8} {'X/M':>6} {'M graph':>8} {'X/M':>6} {'host us M':>9} {'X':>6} {'ck/none eager':>13} {'ck/none graph':>13}  per round X/M graph")
for k in am[0]:
    e_m, e_x, g_m, g_x = med(am, k), med(ax, k), med(gm, k), med(gx, k)
    c1 = f"{med(ck, k)/e_x:13.3f}" if k in ck[0] else " " * 13
    c2 = f"{med(gck, k)/g_x:13.3f}" if k in gck[0] else " " * 13
    print(f"{k:<12} {e_m:8.4f} {e_x/e_m:6.3f} {g_m:8.4f} {g_x/g_m:6.3f} {med(am, k, 'host_us_median'):9.1f} {med(ax, k, 'host_us_median'):6.1f} {c1} {c2}  "
          + " ".join(f"{y[k]['ours_ms_median']/x[k]['ours_ms_median']:.3f}" for x, y in zip(gm, gx)))
print("checkpoint rounds (graph):", [" ".join(f"{c[k]['ours_ms_median']/g[k]['ours_ms_median']:.3f}" for k in c) for c, g in zip(gck, gx)])
PY
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/X/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
export FLASH_KDA_GPU_PLANS=auto,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool build-dev/X/test_cuda_sanitize --gtest_filter='*Forward*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for pl in split16 split32; do
  [[ $((SECONDS-S)) -lt 520 ]] && timeout 60 $NCU --kernel-name regex:kda_prep --launch-skip 2 --launch-count 1 --metrics $M build-dev/X/kda_bench prefill --reps 1 --plans $pl fixed32 > $O/ncu_prep_$pl.txt 2>&1
  echo "prep $pl"; grep -E "gpu__time|inst_executed|wavefronts|dram__bytes|pct" $O/ncu_prep_$pl.txt | sed 's/  */ /g'
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
