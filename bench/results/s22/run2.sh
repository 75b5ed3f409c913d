#!/bin/bash
# device run 2 (session 22): main at the start (h = 02bde0b) -- its GPU tests under every plan, then
# segment 0's length with segment 0 on two CTAs swept: L0 = (q L + 4) / 8 for q = 8, 9, 11, 12
# (h: q = 10, i.e. 125 %; builds q8 ... q12 change only that constant and the planner's matching L),
# `kda_bench prefill --reps 10 --graph`, three alternating rounds. Shipped as build-dev/s22.tar.xz.
set -u
D=$OUT
mkdir -p $D/tests $D/ab
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
(cd build-dev && tar -xJf s22.tar.xz)
B=build-dev/s22
SANITIZERS= bash scripts/gpu_tests_prebuilt.sh $B/h /tmp/tests 2>&1 | grep -v "^  cuda"
tar czf $D/tests/logs.tgz -C /tmp/tests .
OUT=/tmp/ab bash scripts/ab_bench.sh $B/h/kda_bench $B/q8/kda_bench $B/q9/kda_bench $B/q11/kda_bench $B/q12/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph ${CASES:-fixed32 long64k_32 fixed16 fixed12 h8_8k h4_64k} | grep -v "^== round"
tar czf $D/ab/all.tgz -C /tmp/ab .
# X (experiment, not in the tree): the unsplit prepared walk of fixed96 (96 parts: one 8-warp CTA each
# on 96 of 132 SMs) as 4 slices of 2-warp CTAs with a 68 KB ring, 3 CTAs an SM (6 consumer warps);
# its test_cuda_forward under the automatic plan (fixed96 is a checked BENCH case), then h vs X.
FLASH_KDA_GPU_PLANS=auto timeout 100 $B/x/test_cuda_forward > /tmp/tests/x_forward.log 2>&1; echo "x forward rc=$? $(grep -c ' ok$' /tmp/tests/x_forward.log) ok"
grep -E "fixed96" /tmp/tests/x_forward.log | head -4
OUT=/tmp/abx bash scripts/ab_bench.sh $B/h/kda_bench $B/x/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph ${XCASES:-fixed96 fixed64 fixed96_d64 mix20k h8_8k h4_64k fixed32} | grep -v "^== round"
tar czf $D/ab/allx.tgz -C /tmp/abx .
