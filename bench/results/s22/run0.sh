#!/bin/bash
# session 22's first call, whichever card comes: on an H200 run 1 (GPU tests, then the Python speed
# suite: the BENCH protocol's card), on another card run 2 (GPU tests, then the segment-0 sweep).
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$G" in
  *H200*) bash bench/results/s22/run1.sh "$1" ;;
  *) bash bench/results/s22/run2.sh ;;
esac
