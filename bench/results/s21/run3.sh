#!/bin/bash
# device run 3 (session 21): N = 7c2e976 against R2 = c302cc7 (the register reallocation of the 8-warp
# recurrence CTA only for 16-token walks), from graphs, three rounds, with and without --ckpt 1024;
# R2's GPU tests under every plan; with SUITE=1, then the Python speed suite of commit $1 (run2.sh).
# Shipped as build-dev/s21c.tar.xz.
set -u
D=$OUT
mkdir -p $D/ab $D/suite
exec > >(tee $D/log.txt) 2>&1
O=/tmp/o3; mkdir -p $O
(cd build-dev && tar -xJf s21c.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
R=${ROUNDS:-3}
OUT=$O/ab bash scripts/ab_bench.sh build-dev/N/kda_bench build-dev/R2/kda_bench $R -- prefill --reps 10 --graph ${CASES:-fixed96 varlen6_96 fixed64 mix20k fixed32_sp fixed32 long64k_32 h8_8k fixed12} | grep -v "^== round"
OUT=$O/ck bash scripts/ab_bench.sh build-dev/N/kda_bench build-dev/R2/kda_bench $R -- prefill --reps 10 --graph --ckpt 1024 ${CK_CASES:-fixed96 fixed32 h8_8k h4_64k} | grep -v "^== round"
SANITIZERS= PLANS=auto,fused,prepared,split:1,split:4,prepared32,split32 bash scripts/gpu_tests_prebuilt.sh build-dev/R2 $O/tests 2>&1 | grep -v "^  cuda"
tar czf $D/ab/all.tgz -C $O .
[[ ${SUITE:-0} == 1 ]] && OUT=$D/suite bash bench/results/s21/run2.sh $1
