#!/bin/bash
# device run 2 (session 19). X = 11158ac (the preparation beside the plan kernel, fixed batches
# without checkpoints), X2 = X + the same with checkpoints but no checkpoint_start; V1, V2, V4 =
# attribution builds of X2's pair preparation (results wrong; timed under ncu only): V2 without
# the epilogue (-T_b) Y, V1 without it and the cross blocks, V4 also without the stash of k_dec_a.
# Shipped as build-dev/s19b.tar.xz. Graph-mode A/B X, X2 with and without --ckpt 1024 (three
# rounds); X2's GPU tests, memcheck / racecheck; ncu of the preparation (fixed32) for X2 with 16-
# and 32-token steps and the attribution builds; ncu of every kernel of one fixed32 call of X2.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19b.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k long64k_32"
for r in 1 2 3; do
  for b in X X2; do
    build-dev/$b/kda_bench prefill --reps 10 --graph --json $O/gr_${b}_$r.json $CK > /dev/null 2>&1
    build-dev/$b/kda_bench prefill --reps 10 --graph --ckpt 1024 --json $O/gck_${b}_$r.json $CK > /dev/null 2>&1
  done
done
echo "== tables $(t)"
python3 - <<'PY'
import json, statistics, glob
def load(t): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{t}_*.json'))]
def med(rs, k): return statistics.median(x[k]['ours_ms_median'] for x in rs)
g1, g2, c1, c2 = load('gr_X'), load('gr_X2'), load('gck_X'), load('gck_X2')
print(f"{'case':<12} {'X none':>8} {'X2/X':>6} {'X ck':>8} {'X2 ck/X ck':>10} {'X2 ck/X2 none':>13}  per round X2 ck / X2 none")
for k in g1[0]:
    print(f"{k:<12} {med(g1,k):8.4f} {med(g2,k)/med(g1,k):6.3f} {med(c1,k):8.4f} {med(c2,k)/med(c1,k):10.3f} {med(c2,k)/med(g2,k):13.3f}  "
          + " ".join(f"{c[k]['ours_ms_median']/g[k]['ours_ms_median']:.3f}" for c, g in zip(c2, g2)))
PY
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/X2/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
export FLASH_KDA_GPU_PLANS=auto,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool build-dev/X2/test_cuda_sanitize --gtest_filter='*Forward*:*Checkpoint*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,dram__bytes.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
prep() {  # build plan tag
  timeout 60 $NCU --kernel-name regex:kda_prep --launch-skip 2 --launch-count 1 --metrics $M build-dev/$1/kda_bench prefill --reps 1 --plans $2 fixed32 > $O/ncu_prep_$3.txt 2>&1
  echo "prep $3: $(grep -E 'gpu__time|inst_executed|wavefronts|dram__bytes|pct' $O/ncu_prep_$3.txt | awk '{print $1"="$NF}' | sed 's/gpu__time_duration.sum/us/;s/smsp__inst_executed.sum/inst/;s/l1tex__data_pipe_lsu_wavefronts_mem_shared.sum/wavefronts/;s/dram__bytes.sum/dramMB/;s/l1tex__throughput.avg.pct_of_peak_sustained_elapsed/l1pct/;s/dram__throughput.avg.pct_of_peak_sustained_elapsed/drampct/' | tr '\n' ' ')"
}
prep X2 split16 X2_16; prep X2 split32 X2_32; prep V2 split32 V2; prep V1 split32 V1; prep V4 split32 V4
for c in fixed32 long64k_32; do
  [[ $((SECONDS-S)) -lt 500 ]] && timeout 90 $NCU --kernel-name regex:kda_ --launch-skip 10 --launch-count 5 --metrics gpu__time_duration.sum build-dev/X2/kda_bench prefill --reps 1 $c > $O/ncu_all_$c.txt 2>&1
  echo "$c kernels:"; grep -E "kda_|gpu__time" $O/ncu_all_$c.txt | sed 's/(.*//;s/  */ /g' | paste - - | awk '{print $1, $NF}'
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
