#!/bin/bash
# Session 30, call 3: the matrix decode step's variants against main's folded token walk.
#   builds: m, x (build.sh), x2a, x2b (build2.sh): x2a = two accumulator chains, x2b = x2a + two passes
#   (bf16 pools, D = 128, whole head a CTA).
#   1. the T = 4 decode rows (and two T = 1 controls), m / x / x2a / x2b alternating, two rounds;
#   2. x2b's decode GPU tests; ncu of m's and x2b's kernel on b256_t4_bf16 (if ncu is there).
#   OUT=<dir> bash bench/results/s30/run3.sh
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
for f in build-s30/s30.tar.xz build-s30/s30c.tar.xz; do tar -xJf $f -C build-s30; done
mkdir -p $D/raw/dec
BUILDS="m x x2a x2b"
CASES="b64_t4_fp32 b256_t4_fp32 b64_t4_bf16 b256_t4_bf16 b256_t4_fp32_d64 b256_t4_bf16_d64 b8_t4_bf16 b256_t1_bf16 b256_t1_fp32"
echo "== 1. decode $(t)"
for r in 1 2; do for b in $BUILDS; do
  build-s30/$b/kda_bench decode --reps 30 --json $D/raw/dec/${b}_$r.json $CASES > $D/raw/dec/${b}_$r.txt 2>&1
done; done
python3 bench/results/s27/dec_table.py $D/raw/dec $BUILDS
echo "== 2. tests $(t)"
timeout 120 build-s30/x2b/test_cuda_decode > $D/raw/test_cuda_decode_x2b.log 2>&1
echo "x2b test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_x2b.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_x2b.log) $(t)"
grep -E "^\[  FAILED|Failure" $D/raw/test_cuda_decode_x2b.log | head -5
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
if [ -n "$NCU" ]; then
  for b in m x2b; do
    timeout 120 $NCU --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis -k regex:kda_decode -c 1 build-s30/$b/kda_bench decode --reps 1 b256_t4_bf16 \
      > $D/raw/ncu_$b.txt 2>&1
    echo "ncu $b rc=$? $(t)"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots|Warp Cycles Per Issued|Achieved Occupancy|Registers|No Eligible|Stall|Theoretical Occ" $D/raw/ncu_$b.txt | head -24
  done
fi
tar czf $D/raw.tgz -C $D raw
rm -rf $D/raw
echo "== done $(t)"
