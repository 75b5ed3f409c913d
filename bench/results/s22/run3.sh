#!/bin/bash
# device run 3 (session 22, warm machine after run 2): ncu of fixed96's kernels (time, DRAM and L2
# bytes, issue-active) for main (h) and P, one call each after warm-up.
set -u
D=$OUT
exec > >(tee $D/log3.txt) 2>&1
(cd build-dev && tar -xJf s22.tar.xz)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in h p; do
  timeout 150 $NCU --kernel-name regex:kda_ --launch-skip 3 --launch-count 3 \
    --metrics gpu__time_duration.sum,dram__bytes.sum,lts__t_bytes.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    build-dev/s22/$b/kda_bench prefill --reps 1 fixed96 > $D/ncu_fixed96_$b.txt 2>&1
  echo "== $b"; grep -E "kda_|gpu__time|dram__bytes|lts__t_bytes|inst_executed|issue_active|wavefronts" $D/ncu_fixed96_$b.txt | sed 's/  */ /g' | head -40
done
