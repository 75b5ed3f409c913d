#!/usr/bin/env bash
# The full benchmark on one H200 (about 10 minutes, or two calls with PARTS below), from the
# repository root:
#   1. fla's wheels (.whl/, carried: git-ignored) into /tmp/site, then `pip install .` (builds the
#      CUDA kernels and the binding for the machine's Python);
#   2. python -m flash_kda.bench all: the prefill speed suite of BENCH.md (copy floor in the same
#      run; fla's Triton chunk_kda on FLA_CASES), the accuracy suite against float64 (flash-kda and
#      fla), and the end-to-end fla KDA layer stacks (Kimi-Linear-like, Kimi-K3-like; 8K and 32K
#      tokens), in one process so that fla autotunes each H once;
#   3. the report: OUT/bench.json, OUT/BENCHMARK_H200.md, OUT/{speed,floor_ratio,accuracy,e2e}.png
#      and OUT/run.log (7 files).
# Then, on the development machine (files_at = where the device tool put OUT's files):
#   mkdir -p bench/results/h200 && cp files_at/{bench.json,*.png} bench/results/h200/ &&
#   cp files_at/BENCHMARK_H200.md . && cp files_at/run.log bench/results/h200/
# BENCHMARK_H200.md can be regenerated from the committed JSON at any time (no GPU needed):
#   python -m flash_kda.bench report bench/results/h200/bench.json --md BENCHMARK_H200.md \
#     --plots bench/results/h200 --title "flash-kda on an H200" --preamble bench/h200_preamble.md
#
# Usage (device tool: carry [".whl"]):
#   FLASH_KDA_COMMIT=$(git rev-parse HEAD) bash bench/run_h200.sh
# Knobs (environment): PARTS (default "speed accuracy e2e"; all three need ~10 minutes with fla's
# autotuning, so under a 10-minute limit per call run PARTS="speed accuracy" and PARTS=e2e in two
# calls and merge their bench.json files with `python -m flash_kda.bench report A.json B.json`),
# OUT (default /tmp/flash_kda_h200), LIMIT (seconds for the whole script,
# default 470: the benchmark gets what the install leaves, minus the report's time), FLA_CASES
# (default: the cases with H = 96 and 32, the heads the end-to-end stacks use too, so fla autotunes
# two H in all; "all" for every case, "none"), FLA_BUDGET (seconds of the speed suite after which
# fla starts no new H, default 200), E2E_TOKENS (default "8192 32768"), REPS (default 30),
# SKIP_INSTALL=1 (flash-kda is installed already), BENCH_ARGS (more options for the benchmark).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flash_kda_h200}
LIMIT=${LIMIT:-470}
FLA_CASES=${FLA_CASES:-fixed96 varlen6_96 v1024x8_96 fixed32 b16x2048_32 long64k_32}
WORK=$(mktemp -d /tmp/flash_kda_bench.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

main() {
  SECONDS=0
  echo "== [${SECONDS}s] $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "no .whl/*.whl here (carry .whl): fla will not be timed"
  fi
  if [[ -z ${SKIP_INSTALL:-} ]]; then
    echo "== [${SECONDS}s] pip install ."
    if ! python3 -m pip install -q --no-build-isolation --no-deps . >"$WORK/pip.log" 2>&1; then
      tail -n 40 "$WORK/pip.log"
      return 1
    fi
  fi
  echo "== [${SECONDS}s] installed; python -m flash_kda.bench ${PARTS:-all}"
  local left=$((LIMIT - SECONDS - 30))
  local status=0
  timeout --signal=TERM --kill-after=10 "$left" python3 -m flash_kda.bench ${PARTS:-all} --no-progress \
    --fla ${FLA_CASES} --fla-budget "${FLA_BUDGET:-200}" --reps "${REPS:-30}" \
    --tokens ${E2E_TOKENS:-8192 32768} --out "$WORK/run" ${BENCH_ARGS:-} || status=$?
  [[ $status == 124 ]] && echo "!! the benchmark ran out of its ${left}s: the report holds what finished"
  echo "== [${SECONDS}s] report"
  if [[ -f $WORK/run/bench.json ]]; then
    python3 -m flash_kda.bench report "$WORK/run/bench.json" --json "$OUT/bench.json" --plots "$OUT" \
      --images bench/results/h200 --md "$OUT/BENCHMARK_H200.md" --title "flash-kda on an H200" \
      --preamble bench/h200_preamble.md || status=1
  else
    echo "no results were written"
    status=1
  fi
  echo "== [${SECONDS}s] done (status $status); files: $(cd "$OUT" && ls | tr '\n' ' ')"
  return $status
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
