#!/usr/bin/env bash
# The GPU checks of the CUDA forward, for anyone with an H200 (sm_90). In order:
#   1. correctness against the float64 reference and the fp32 GPU recurrence: the GPU tests of
#      tests/gpu (ctest -L gpu: forward under every plan of PLANS, checkpoints, prefill on pools,
#      decode, context parallelism; one log a test);
#   2. compute-sanitizer memcheck and racecheck on small varlen forward and decode cases
#      (tests/gpu/test_cuda_sanitize, plans SANITIZE_PLANS);
#   3. the prefill and decode benchmarks from C++ (bench/cpp/kda_bench prefill, decode:
#      median, copy floor in the run);
#   4. if Python with torch is present: pip install . (no build isolation: works offline), the
#      Python benchmark (python -m flash_kda.bench speed: results in OUTDIR/bench_py/) with fla's
#      Triton chunk_kda timed on the same inputs when fla is importable, and pytest including the
#      CUDA tests. fla: have it installed (pip install flash-linear-attention), or, on a machine
#      without network access, put its wheel files (and those of its dependencies) into .whl/ at the
#      root of the checkout: they are installed into /tmp/site, which is put on PYTHONPATH.
# Usage: bash scripts/gpu_check.sh [build-dir] [out-dir]        (FLA_CASES="fixed96 fixed32" by default)
# The build folder is configured and built here (the GPU tests and kda_bench: needs GoogleTest).
# PLANS (the forward plans of step 1) defaults to the tests' own list (tests/gpu/harness.cuh),
# SANITIZE_PLANS to auto,fused,split:3.
set -uo pipefail
BUILD=${1:-build-cuda}
OUTDIR=${2:-${OUT:-/tmp/flash_kda_gpu}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
GPU_TESTS=(test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool test_cuda_decode
           test_cuda_context_parallel)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$BUILD" -j"$(nproc)" --target kda_bench "${GPU_TESTS[@]}" test_cuda_sanitize || exit 1
BENCH=$BUILD/bench/cpp/kda_bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
# Every forward plan the planner can choose, forced (docs/kernel.md, "Plans"): the tests' default
# unless PLANS is set.
[[ -n ${PLANS:-} ]] && export FLASH_KDA_GPU_PLANS=$PLANS
echo "== GPU tests (plans: ${FLASH_KDA_GPU_PLANS:-default})"
for t in "${GPU_TESTS[@]}"; do
  "$BUILD/tests/gpu/$t" >"$OUTDIR/$t.log" 2>&1 || status=1
  grep -E "FAIL|^\[  PASSED |exit 77" "$OUTDIR/$t.log" | sed "s|^|$t: |"
done
for tool in memcheck racecheck; do
  echo "== compute-sanitizer $tool"
  FLASH_KDA_GPU_PLANS=${SANITIZE_PLANS:-auto,fused,split:3} compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$BUILD/tests/gpu/test_cuda_sanitize" >"$OUTDIR/sanitize_$tool.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |exit 77" "$OUTDIR/sanitize_$tool.log"
done
echo "== bench (C++)"
"$BENCH" prefill --reps "${REPS:-30}" --json "$OUTDIR/bench_cpp.json" 2>&1 | grep -v seed || status=1
echo "== bench-decode (C++)"
"$BENCH" decode --reps "${REPS:-30}" --json "$OUTDIR/bench_decode.json" 2>&1 | grep -v seed || status=1
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
