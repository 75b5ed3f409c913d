#!/usr/bin/env bash
# The GPU checks of the CUDA forward, for anyone with an H200 (sm_90):
#   correctness against the float64 reference and the fp32 GPU recurrence, compute-sanitizer
#   memcheck and racecheck on a small varlen case, then the BENCH.md prefill benchmark.
# Usage: bash scripts/gpu_check.sh [build-dir] [out-dir]
# The build folder is configured and built here if it holds no kda_gpu_check yet.
set -uo pipefail
BUILD=${1:-build-cuda}
OUTDIR=${2:-${OUT:-/tmp/flash_kda_gpu}}
mkdir -p "$OUTDIR"
TOOL=$BUILD/tools/kda_gpu_check
if [[ ! -x $TOOL ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=OFF >/dev/null &&
    cmake --build "$BUILD" -j"$(nproc)" --target kda_gpu_check || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
status=0
echo "== check"; "$TOOL" check 2>&1 | tee "$OUTDIR/check.log" || status=1
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$TOOL" sanitize >"$OUTDIR/sanitize_$tool.log" 2>&1 || status=1
  tail -n 3 "$OUTDIR/sanitize_$tool.log"
done
echo "== bench"; "$TOOL" bench --reps "${REPS:-50}" --json "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/bench.log" || status=1
exit $status
