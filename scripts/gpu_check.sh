#!/usr/bin/env bash
# The GPU checks of the CUDA forward, for anyone with an H200 (sm_90). In order:
#   1. correctness against the float64 reference and the fp32 GPU recurrence (kda_gpu_check check;
#      forward under every plan, and decode);
#   2. compute-sanitizer memcheck and racecheck on small varlen forward and decode cases;
#   3. the prefill and decode benchmarks from C++ (kda_gpu_check bench, bench-decode:
#      median, copy floor in the run);
#   4. if Python with torch is present: pip install . (no build isolation: works offline), the
#      Python benchmark (python -m flash_kda.bench speed: results in OUTDIR/bench_py/) with fla's
#      Triton chunk_kda timed on the same inputs when fla is importable, and pytest including the
#      CUDA tests. fla: have it installed (pip install flash-linear-attention), or, on a machine
#      without network access, put its wheel files (and those of its dependencies) into .whl/ at the
#      root of the checkout: they are installed into /tmp/site, which is put on PYTHONPATH.
# Usage: bash scripts/gpu_check.sh [build-dir] [out-dir]        (FLA_CASES="fixed96 fixed32" by default)
# The build folder is configured and built here if it holds no kda_gpu_check yet.
set -uo pipefail
BUILD=${1:-build-cuda}
OUTDIR=${2:-${OUT:-/tmp/flash_kda_gpu}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
TOOL=$BUILD/tools/kda_gpu_check
if [[ ! -x $TOOL ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH_KDA_BUILD_TESTS=OFF >/dev/null &&
    cmake --build "$BUILD" -j"$(nproc)" --target kda_gpu_check || exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
# Every forward plan the planner can choose, forced (docs/kernel.md, "Plans"); split:1 and split:4
# cut even the short edge cases into many segments.
PLANS=${PLANS:-auto,fused,prepared,split:1,split:4}
echo "== check ($PLANS)"; "$TOOL" check --plans "$PLANS" >"$OUTDIR/check.log" 2>&1 || status=1
grep -E "FAIL|PASSED|FAILED" "$OUTDIR/check.log"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$TOOL" sanitize --plans auto,fused,split:3 \
    >"$OUTDIR/sanitize_$tool.log" 2>&1 || status=1
  tail -n 1 "$OUTDIR/sanitize_$tool.log"
done
echo "== bench (C++)"; "$TOOL" bench --reps "${REPS:-30}" --json "$OUTDIR/bench_cpp.json" 2>&1 | grep -v seed || status=1
echo "== bench-decode (C++)"
"$TOOL" bench-decode --reps "${REPS:-30}" --json "$OUTDIR/bench_decode.json" 2>&1 | grep -v seed || status=1
if python3 -c "import torch" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  fi
  python3 -m pip install -q --no-build-isolation --no-deps . >"$OUTDIR/pip.log" 2>&1 || { status=1; tail "$OUTDIR/pip.log"; }
  FLA=(--fla none)
  python3 -c "import fla" 2>/dev/null && FLA=(--fla ${FLA_CASES:-fixed96 fixed32})
  echo "== pytest"; python3 -m pytest tests/python -q >"$OUTDIR/pytest.log" 2>&1 || status=1
  tail -n 1 "$OUTDIR/pytest.log"
  echo "== bench (Python, fla alongside)"
  python3 -m flash_kda.bench speed "${FLA[@]}" --reps 20 --no-progress --no-plots --out "$OUTDIR/bench_py" \
    >"$OUTDIR/bench_py.log" 2>&1 || status=1
  grep -A 14 "^| case" "$OUTDIR/bench_py.log"
fi
exit $status
