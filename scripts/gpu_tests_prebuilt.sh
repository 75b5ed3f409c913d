#!/usr/bin/env bash
# The GPU tests of the forward from prebuilt binaries (built elsewhere and shipped to the GPU
# machine): test_cuda_forward, test_cuda_checkpoints and test_cuda_prefill_pool under every plan
# (PLANS), then compute-sanitizer memcheck and racecheck on test_cuda_sanitize's forward and
# checkpoint cases (SANITIZE_PLANS; SANITIZERS= skips them). One log a run in OUTDIR, one summary line a run on stdout,
# and the stress rows of the 32-token and automatic plans (their errors against float64).
#   bash scripts/gpu_tests_prebuilt.sh BINDIR OUTDIR
set -u
BIN=$1
OUTDIR=$2
mkdir -p "$OUTDIR"
export FLASH_KDA_GPU_PLANS=${PLANS:-auto,fused,prepared,split:1,split:4,prepared32,split32,split32:4}
for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
  timeout 100 "$BIN/$x" > "$OUTDIR/$x.log" 2>&1
  echo "$x rc=$? $(grep -c ' ok$' "$OUTDIR/$x.log") ok $(grep -ciE 'fail' "$OUTDIR/$x.log") fail-lines"
done
grep -E "stress|neg eigval|x 3e4|1e-3" "$OUTDIR/test_cuda_forward.log" | grep -E "prepared32|split32|cuda/auto" | head -12
export FLASH_KDA_GPU_PLANS=${SANITIZE_PLANS:-auto,fused,split:3,split32,prepared32}
for tool in ${SANITIZERS-memcheck racecheck}; do
  timeout 120 compute-sanitizer --tool $tool "$BIN/test_cuda_sanitize" --gtest_filter='*Forward*:*Checkpoint*' \
    > "$OUTDIR/san_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/san_$tool.log" | tail -1)"
done
