#!/usr/bin/env bash
# GPU checks of the PyTorch layer, for an H200 (sm_90) with torch installed; works offline:
#   1. install: flash-kda itself (pip install --no-build-isolation --no-deps .: compiles the sm_90a
#      kernels). The fla tests need fla: have it installed (pip install flash-linear-attention),
#      or, without network access, put its wheel files (and its dependencies') into .whl/ at the
#      root of the checkout: they are installed into /tmp/site, which is put on PYTHONPATH;
#   2. test: pytest tests/python (CUDA tests included: CUDA graphs, streams, torch.compile on CUDA)
#      and tests/gpu (fla 0.6.0 dispatching chunk_kda to flash-kda, against its Triton path);
#   3. bench: bench/host_overhead.py (microseconds per eager call of fwd, chunk_kda, the operators).
# Usage: bash tests/gpu/run_h200.sh [install] [test] [bench]      (no argument: all three)
#        FULL=1 bash tests/gpu/run_h200.sh test                    (all of tests/python, not only
#                                                                   the files of the torch layer)
# The steps can run in separate calls on the same machine (install first). Outputs (logs, JSON) go
# to $OUT, else /tmp/flash_kda_torch_gpu. Exit status 1 if anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-/tmp/flash_kda_torch_gpu}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(install test bench)
status=0

if compgen -G ".whl/*.whl" >/dev/null; then
  if [[ ! -d /tmp/site/fla ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl ||
      echo "warning: could not install .whl/*.whl"
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

for step in "${STEPS[@]}"; do
  case $step in
    install)
      {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
        python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -n 1
      } | tee "$OUTDIR/env.txt"
      echo "== pip install . (sm_90a kernels)"
      start=$SECONDS
      if python3 -m pip install -q --no-build-isolation --no-deps . >"$OUTDIR/pip.log" 2>&1; then
        echo "installed in $((SECONDS - start)) s"
      else
        status=1
        tail -n 30 "$OUTDIR/pip.log"
      fi
      python3 -c "import flash_kda as f; print('flash_kda', f.__version__, 'cuda_available', f.cuda_available())"
      ;;
    test)
      python3 -c "import flash_kda, sys; sys.exit(not flash_kda.cuda_available())" ||
        { echo "flash_kda with CUDA not installed: run the install step first"; exit 1; }
      # FULL=1: all of tests/python (other parts of the package too), else the files the torch
      # layer touches
      if [[ ${FULL:-0} == 1 ]]; then FILES=(tests/python tests/gpu); else
        FILES=(tests/python/test_torch_ops.py tests/python/test_torch.py tests/python/test_fwd.py
               tests/python/test_errors.py tests/python/test_main.py tests/gpu)
      fi
      echo "== pytest ${FILES[*]}"
      python3 -m pytest "${FILES[@]}" -v -rA -p no:cacheprovider --durations=15 \
        >"$OUTDIR/pytest.log" 2>&1 || status=1
      # the CUDA and fla tests by name, fla's errors, then failures and the summary
      grep -oE "^tests/[^ ]*(cuda|gpu/|::test_compile)[^ ]* .*(PASSED|FAILED|SKIPPED|ERROR)" "$OUTDIR/pytest.log" |
        sed -E 's/ +\[ *[0-9]+%\]$//'
      grep -E "^(errors: |fla -> )" "$OUTDIR/pytest.log" | tee "$OUTDIR/fla_errors.txt"
      grep -E "^(FAILED|ERROR) " "$OUTDIR/pytest.log" | head -n 40
      tail -n 1 "$OUTDIR/pytest.log"
      ;;
    bench)
      echo "== host overhead (bench/host_overhead.py)"
      python3 bench/host_overhead.py --json "$OUTDIR/host_overhead.json" 2>&1 | tee "$OUTDIR/host_overhead.txt" ||
        status=1
      ;;
    *)
      echo "unknown step: $step (install, test, bench)"
      exit 2
      ;;
  esac
done
exit $status
