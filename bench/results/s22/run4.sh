#!/bin/bash
# device run 4 (session 22): M = main with the packed walk (P) and segment 0's length by segment
# count ($1 = its commit), shipped as build-dev/s22b.tar.xz (m/: kda_bench and the GPU tests; h/:
# main at the start's kda_bench). Its GPU tests under every plan; then on an H200 the Python speed
# suite of the checkout (pip install ., FlashKDA and fla timed in the same run: the BENCH protocol),
# on another card memcheck / racecheck and M against h from graphs (three alternating rounds).
set -u
D=$OUT
mkdir -p $D/tests $D/ab $D/suite
exec > >(tee $D/log4.txt) 2>&1
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
(cd build-dev && tar -xJf s22b.tar.xz)
B=build-dev/s22b
case "$G" in
  *H200*)
    SANITIZERS= bash scripts/gpu_tests_prebuilt.sh $B/m /tmp/tests 2>&1 | grep -v "^  cuda"
    tar czf $D/tests/logs.tgz -C /tmp/tests .
    OUT=$D/suite RUN6_LIMIT=${RUN6_LIMIT:-450} bash bench/results/s21/run2.sh $1 ;;
  *)
    bash scripts/gpu_tests_prebuilt.sh $B/m /tmp/tests 2>&1 | grep -v "^  cuda"
    tar czf $D/tests/logs.tgz -C /tmp/tests .
    OUT=/tmp/ab bash scripts/ab_bench.sh $B/h/kda_bench $B/m/kda_bench ${ROUNDS:-3} -- prefill --reps 10 --graph ${CASES:-fixed96 fixed64 fixed32 long64k_32 fixed16 fixed12 h8_8k h4_64k mix20k} | grep -v "^== round"
    tar czf $D/ab/all.tgz -C /tmp/ab . ;;
esac
