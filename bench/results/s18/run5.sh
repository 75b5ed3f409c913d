#!/bin/bash
# device run 5 (session 18): the GPU decode tests and decode sanitizers of the one-token two-pass decode
# with its GPU cases fixed (build-dev/d1b.tar.xz: test_cuda_decode, test_cuda_sanitize of 681e3b8 +
# the cases of one and two passes; run 4's binaries still had the earlier cases).
set -u
exec > >(tee $OUT/log.txt) 2>&1
(cd build-dev && tar -xJf d1b.tar.xz)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 build-dev/D1b/test_cuda_decode > $OUT/test_cuda_decode.log 2>&1
echo "test_cuda_decode rc=$? $(grep -c ' ok$' $OUT/test_cuda_decode.log) ok $(grep -ciE 'fail' $OUT/test_cuda_decode.log) fail-lines"
grep -E '640 pairs' $OUT/test_cuda_decode.log
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool build-dev/D1b/test_cuda_sanitize --gtest_filter='*Decode*' > $OUT/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.log | tail -1)"
done
