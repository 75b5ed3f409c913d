#!/bin/bash
# Session 31, call 3: where the streaming decode kernel's time goes — ncu of n (314d257, one CTA a
# unit) and s (streaming, bench/results/s31/build.sh) on b256_t4_bf16 (streaming lost 7.7 %) and
# b64_t4_bf16 (won 7 %): speed of light, occupancy, and the average warp stall reasons per issued
# instruction; then n's decode GPU tests and sanitizers (the matrix step as kept). Builds as run2.sh.   OUT=<dir> bash bench/results/s31/run3.sh
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
mkdir -p build-s31 && tar -xJf build-s30/s30d.tar.xz -C build-s31 && tar -xJf build-s31/s31.tar.xz -C build-s31
mkdir -p $D/raw
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
for c in b256_t4_bf16 b64_t4_bf16; do for b in n s; do
  timeout 100 $NCU --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__bytes_write.sum \
    -k regex:kda_decode -c 1 build-s31/$b/kda_bench decode --reps 1 $c > $D/raw/ncu_${b}_$c.txt 2>&1
  echo "== $b $c rc=$? $(t)"
  grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Achieved Occ|dram__bytes" $D/raw/ncu_${b}_$c.txt | head -8
  grep -E "issue_stalled" $D/raw/ncu_${b}_$c.txt | awk '$NF+0 > 0.3' | sort -k3 -g -r | head -8
done; done
# n's decode GPU tests, memcheck and racecheck (session 30's run4.sh, never run: the kept matrix step)
timeout 150 build-s31/n/test_cuda_decode > $D/raw/test_cuda_decode_n.log 2>&1
echo "n test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_n.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_n.log) $(t)"
grep -E "^\[  FAILED|Failure" $D/raw/test_cuda_decode_n.log | head -5
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool build-s31/n/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_n_$tool.log 2>&1
  echo "n decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_n_$tool.log | tail -1) $(t)"
done
tar czf $D/raw.tgz -C $D raw
rm -rf $D/raw
echo "== done $(t)"
