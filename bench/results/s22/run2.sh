#!/bin/bash
# device run 2 (session 22): P's GPU tests under every plan (P below), then, for main at the start
# (h = 02bde0b), segment 0's length with segment 0 on two CTAs swept: L0 = (q L + 4) / 8 for q = 8, 9, 11, 12
# (h: q = 10, i.e. 125 %; builds q8 ... q12 change only that constant and the planner's matching L),
# `kda_bench prefill --reps 10 --graph`, three alternating rounds. Shipped as build-dev/s22.tar.xz.
set -u
D=$OUT
mkdir -p $D/tests $D/ab
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
(cd build-dev && tar -xJf s22.tar.xz)
B=build-dev/s22
SANITIZERS= bash scripts/gpu_tests_prebuilt.sh $B/p /tmp/tests 2>&1 | grep -v "^  cuda"
tar czf $D/tests/logs.tgz -C /tmp/tests .
OUT=/tmp/ab bash scripts/ab_bench.sh $B/h/kda_bench $B/q8/kda_bench $B/q9/kda_bench $B/q11/kda_bench $B/q12/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph ${CASES:-fixed32 long64k_32 fixed16 fixed12 h8_8k h4_64k} | grep -v "^== round"
tar czf $D/ab/all.tgz -C /tmp/ab .
# P (013a686 on main): an unsplit walk whose parts leave SMs idle but do not fit twice (fixed96: 96
# parts, one 8-warp CTA each on 96 of 132 SMs) as four 2-warp CTAs a part with a 68 KB ring, three an
# SM (6 consumer warps an SM); h vs P.
OUT=/tmp/abp bash scripts/ab_bench.sh $B/h/kda_bench $B/p/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph ${PCASES:-fixed96 fixed64 fixed32} | grep -v "^== round"
OUT=/tmp/abpc bash scripts/ab_bench.sh $B/h/kda_bench $B/p/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph --ckpt 1024 fixed96 | grep -v "^== round"
tar czf $D/ab/allp.tgz -C /tmp/abp . -C /tmp/abpc .
