#!/bin/bash
# device run 1 (session 21). H = 4262088 (main at the start: fp16 M, 6ced3df); N = 7c2e976 (pair walks
# without output copy only the output-free prefixes and (-T)[b][a]); R = 093e8f8 (N + the 8-warp
# recurrence CTA with a loader warpgroup and setmaxnreg). Shipped as build-dev/s21b.tar.xz.
# Graph-mode A/B (scripts/ab_bench.sh, three rounds) with and without --ckpt 1024; ncu of every kernel
# of one fixed32 and one long64k_32 call of each; R's GPU tests under every plan, memcheck, racecheck.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s21b.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp varlen6_96 fixed96_d64 fixed16_d64 fixed16_d64_sp"
OUT=$O/ab bash scripts/ab_bench.sh build-dev/H/kda_bench build-dev/N/kda_bench build-dev/R/kda_bench 3 -- prefill --reps 10 --graph $CASES | grep -v "^== round"
echo "== ckpt $(t)"
OUT=$O/ck bash scripts/ab_bench.sh build-dev/H/kda_bench build-dev/N/kda_bench build-dev/R/kda_bench 3 -- prefill --reps 10 --graph --ckpt 1024 fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k long64k_32 | grep -v "^== round"
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in fixed32 long64k_32; do
  for b in H N R; do
    timeout 100 $NCU --kernel-name regex:kda_ --launch-skip 10 --launch-count 5 --metrics gpu__time_duration.sum,dram__bytes.sum build-dev/$b/kda_bench prefill --reps 1 $c > $O/ncu_${c}_$b.txt 2>&1
    echo "$c $b: $(grep -E 'gpu__time|dram__bytes' $O/ncu_${c}_$b.txt | awk '{print $(NF-1), $NF}' | tr '\n' ' ')"
  done
done
echo "== tests $(t)"
bash scripts/gpu_tests_prebuilt.sh build-dev/R $O
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
