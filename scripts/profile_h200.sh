#!/usr/bin/env bash
# Profile the sm90 forward kernel with Nsight Compute on an H200: where its warps stall, per CUDA
# source line. For the next optimisation step (docs/perf_log.md): run it before changing the kernel.
#   1. builds the C++ benchmark bench/cpp/kda_bench in BUILD (default build-cuda) if it is not there;
#   2. for each case (default: fixed16 fixed96): one launch of the forward kernel under ncu with
#      the speed-of-light, scheduler, warp-state, instruction and memory sections (text), and the
#      per-source-line counters (CSV, warp-stall samples by reason);
#   3. summarises the CSV with scripts/ncu_lines.py: stall samples by role (producer, consumer,
#      scheduler, ...) and the 25 source lines with the most samples.
# Usage: bash scripts/profile_h200.sh [case ...]      (OUT: output folder, default /tmp/flash_kda_ncu)
# Cases are those of `kda_bench prefill` (bench/cpp/kda_bench.cu). About 1 minute per case (ncu
# replays the kernel once per section group).
# Needs: an sm_90 GPU (H100, H200), the CUDA toolkit (nvcc, to build kda_bench), Nsight
# Compute's `ncu` on PATH (in the toolkit's nsight-compute folder, or NVIDIA's nsight-compute
# package) with permission to read the GPU's performance counters (root, or the driver's
# NVreg_RestrictProfilingToAdminUsers=0), cmake, ninja and python3.
set -uo pipefail
cd "$(dirname "$0")/.."
for need in ncu nvcc cmake ninja python3; do
  if ! command -v "$need" >/dev/null; then
    echo "profile_h200.sh: '$need' is not on PATH (needs: ncu, nvcc, cmake, ninja, python3; see the header)" >&2
    exit 1
  fi
done
BUILD=${BUILD:-build-cuda}
OUTDIR=${OUT:-/tmp/flash_kda_ncu}
mkdir -p "$OUTDIR"
TOOL=$BUILD/bench/cpp/kda_bench
if [[ ! -x $TOOL ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=OFF >/dev/null &&
    cmake --build "$BUILD" -j"$(nproc)" --target kda_bench || exit 1
fi
CASES=("$@")
[[ ${#CASES[@]} -eq 0 ]] && CASES=(fixed16 fixed96)
NCU=(ncu --clock-control none -k regex:kda_fwd_kernel -c 1)
status=0
for c in "${CASES[@]}"; do
  echo "== $c"
  "${NCU[@]}" --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis_Tables \
    "$TOOL" prefill --reps 1 "$c" >"$OUTDIR/ncu_$c.txt" 2>&1 || status=1
  grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Shared.*(Bank|Wavefront)" \
    "$OUTDIR/ncu_$c.txt" | sed 's/^ */  /' | head -n 12
  "${NCU[@]}" --section SourceCounters --section WarpStateStats --page source --print-source cuda --csv \
    "$TOOL" prefill --reps 1 "$c" >"$OUTDIR/ncu_${c}_lines.csv" 2>&1 || status=1
  python3 scripts/ncu_lines.py "$OUTDIR/ncu_${c}_lines.csv" --top 25 | tee "$OUTDIR/ncu_${c}_summary.txt" ||
    status=1
done
exit $status
