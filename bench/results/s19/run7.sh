#!/bin/bash
# device run 7 (session 19). T2 = 66a4b3d; H = 6ced3df (M and M[b][a] in fp16 without scale, the
# walks' output product on the fp16 U fragments). Shipped as build-dev/s19f.tar.xz. Graph-mode A/B
# (scripts/ab_bench.sh, three rounds) with and without --ckpt 1024; ncu of one fixed32 call of each;
# H's GPU tests under every plan, memcheck and racecheck.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf s19f.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt
CASES="fixed12 h8_8k h4_64k fixed16 fixed32 long64k_32 mix20k fixed96 fixed64 b16x2048_32 fixed32_sp varlen6_96 fixed96_d64 fixed16_d64 fixed16_d64_sp"
OUT=$O/ab bash scripts/ab_bench.sh build-dev/T2/kda_bench build-dev/H/kda_bench 3 -- prefill --reps 10 --graph $CASES | grep -v "^== round"
OUT=$O/ck bash scripts/ab_bench.sh build-dev/T2/kda_bench build-dev/H/kda_bench 3 -- prefill --reps 10 --graph --ckpt 1024 fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k | grep -v "^== round"
echo "== ncu $(t)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in T2 H; do
  timeout 90 $NCU --kernel-name regex:kda_ --launch-skip 10 --launch-count 5 --metrics gpu__time_duration.sum,dram__bytes.sum build-dev/$b/kda_bench prefill --reps 1 fixed32 > $O/ncu_$b.txt 2>&1
  echo "$b: $(grep -E 'gpu__time|dram__bytes' $O/ncu_$b.txt | awk '{print $NF}' | tr '\n' ' ')"
done
echo "== tests $(t)"
export FLASH_KDA_GPU_PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 build-dev/H/$x > $O/$x.log 2>&1
  echo "$x rc=$? $(grep -c ' ok$' $O/$x.log) ok $(grep -ciE 'fail' $O/$x.log) fail-lines"
done
grep -E "stress|neg eigval|x 3e4|1e-3" $O/test_cuda_forward.log | grep -E "prepared32|split16 |cuda/auto" | head -10
export FLASH_KDA_GPU_PLANS=auto,fused,split:3,split32,prepared32
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool build-dev/H/test_cuda_sanitize --gtest_filter='*Forward*:*Checkpoint*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
echo "== done $(t)"
tar czf $OUT/all.tgz -C $O .
