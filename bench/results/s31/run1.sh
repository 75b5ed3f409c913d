#!/bin/bash
# Session 31, call 1: session 30's call 4 (bench/results/s30/run4.sh: main's decode, n = the matrix
# step as kept, against m = 33df773; n's decode GPU tests, memcheck, racecheck); then, where the card
# is an H200, the Python suite of main with FlashKDA timed in the same run (bench/results/s19/run6.sh).
#   OUT=<dir> bash bench/results/s31/run1.sh <commit>
set -u
mkdir -p $OUT/run4 $OUT/py
OUT=$OUT/run4 bash bench/results/s30/run4.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT/py RUN_FLA=${RUN_FLA:-none} RUN6_LIMIT=480 bash bench/results/s19/run6.sh ${1:-unknown}
fi
